"""Framework adapters: PyTorch 2 (DTensor, FSDP2, the loop API, DCP) and Megatron.
"""
