"""What both experiments of the micro-batch study plan with (pure: no torch).

workloads   AlexNet / ResNet-18 conv layers and DeepBench layers (a subset, or the training set's 3x3
            and 5x5 layers μ-cuDNN benchmarks), as plain shapes
dp          μ-cuDNN's dynamic program per kernel (undivided / powerOfTwo / all), Pareto fronts
ilp         one workspace budget shared by all kernels of a network (HiGHS via scipy milp)

The choice experiment plans PyTorch's algorithms with them, the cuDNN one cuDNN's engines; keeping them
here, rather than in either, leaves neither experiment's package owning the other's planner.
"""
