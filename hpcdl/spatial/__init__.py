"""Spatial scaling study: halo-exchange partitioned Conv3d, CosmoFlow-like hybrid training, analysis."""
