"""The checkpoint study beside Rojas et al.'s paper (resources/papers.yaml; the rows are built by
hpcdl.platform.orchestration.paper_vs_ours). Its abstract publishes no number: the row says what we
measure."""

from __future__ import annotations

from hpcdl.platform import Ours

PAPER = {
    "scope": Ours("checkpoint claims", context=(
        "ours: save / load cost per format (torch.save, safetensors, DCP, HDF5, npz), bytes on disk, "
        "DCP over ranks and bit-identical resume, in PyTorch only (claims roundtrip, resume_bit_identical, "
        "async_blocking, bandwidth_vs_ceiling)")),
}
