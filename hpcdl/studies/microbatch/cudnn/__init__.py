"""μ-cuDNN's own experiment: cuDNN's engines by id under workspace limits (CUDA, microbatch.cudnn.engines).

engines     cuDNN engine configurations listed with their workspace and run by id through NVIDIA's
            cuDNN frontend, on PyTorch's tensors (the binding is imported only when a graph is built)
alignment   (pure) the address alignment of micro-batch views and which plan runs at which offset
bench       one layer's engine benchmark: every plan of every kernel at every micro-batch size
engine_table  `make gpu`'s engine table of a config's networks (python -m ...cudnn.engine_table)
limits      (pure) the seed's workspace-limit planning on an engine table: the fastest undivided engine
            under a limit (the baseline), the DP per kernel under it, the ILP under a network budget
plan        (pure) a network's plans under every limit (configured + the library default, 64 MiB) as
            rows, the measured times attached, the network rollup, plan checks against the table
study       one network's engine table, plans and their execution by engine id against the baseline:
            what the task app's second task runs
why         (pure) why micro-batching pays or not per kernel and limit, read off an engine table
claims      the experiment's two claims; figures: its figures beside the stage's own
"""
