"""The offload study's claim families, judged by the claims stage (offload/claims.py): fast-tier memory
(memory.py), capacity under a budget (capacity.py), hidden transfers (hidden.py), equal final weights
(weights.py), what they share (common.py), and the slow-tier gate over the ones a tier as fast as the
fast one would make meaningless (gate.py)."""
