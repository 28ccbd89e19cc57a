"""ParaDL-style performance oracle: per-layer, per-strategy compute, alpha-beta communication, memory."""
