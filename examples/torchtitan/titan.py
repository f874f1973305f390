"""torchtitan's own llama3 model, parallel dims, parallelize and loss, on CPU.

Everything here is torchtitan 0.3.0's code (ParallelDims.build_mesh, the
llama3 "debugmodel" config from its model registry, Module.parallelize for
tensor parallelism, apply_fsdp_to_decoder for FSDP2, its spmd_types context
and CrossEntropyLoss). Three things differ from `torchtitan.train`, each
because torchtitan on CPU stops there (README.md, "What CPU forced"):
  - the Trainer is not used: its __init__ calls torch.cuda.set_device;
  - ParallelDims builds its meshes for device "cpu" (torchtitan.tools.utils
    falls back to "cuda" when no accelerator is found);
  - attention is torchtitan's ScaledDotProductAttention (causal) instead of
    FlexAttention: "FlexAttention does not support backward on CPU".
The model is the debugmodel with its first LAYERS layers, in float64.
"""

import torch

LAYERS = 2
SEQ_LEN = 32
SPMD_BACKEND = "spmd_types"  # torchtitan's default ParallelismConfig.spmd_backend


def parallel_dims(dp, tp, world):
    """torchtitan's ParallelDims (FSDP over dp_shard, TP over tp) with its
    meshes built on CPU."""
    # The model package first: importing it registers torch's "fake"
    # process-group backend, which build_mesh uses for dims of size 1.
    import torchtitan.models.llama3  # noqa: F401
    import torchtitan.distributed.parallel_dims as pdims
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    pdims.device_type = "cpu"  # torchtitan.tools.utils says "cuda" without a GPU
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=1, tp=tp, pp=1, ep=1,
                        world_size=world, spmd_backend=SPMD_BACKEND)
    dims.build_mesh()
    dist_utils.set_spmd_backend(SPMD_BACKEND)
    return dims


def model_config():
    """llama3 "debugmodel" from torchtitan's registry: its first LAYERS
    layers, causal SDPA attention, sharding config as update_from_config
    sets it (sequence parallel off)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import ComplexRoPE, compute_ffn_hidden_dim
    cfg = model_registry("debugmodel", attn_backend="flex").model
    # debugmodel's layers (its _debugmodel arguments), LAYERS of them, with
    # separate wq/wk/wv: FusedQKVLinear's state-dict hook replaces wqkv by
    # gathered copies named wq/wk/wv, which torch.distributed.checkpoint's
    # get_state_dict cannot map back to a parameter (README.md).
    dim, n_heads = cfg.dim, cfg.layers[0].attention.n_heads
    cfg.layers = llama3._build_llama3_layers(
        n_layers=LAYERS, dim=dim, n_heads=n_heads, fuse_qkv=False,
        hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=256),
        rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=131072, theta=500000,
                                scaling="llama"),
        attn_backend="flex")
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    set_llama3_sharding_config(cfg, enable_sp=False)
    return cfg


def build(dims, seed):
    """The model built on the meta device, parallelized by torchtitan (TP,
    then FSDP2 over dp_shard, float64 compute and gradient reduction),
    materialized on CPU and initialized by init_weights under `seed`."""
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh, validate_config
    cfg = model_config()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            model = cfg.build()
    finally:
        torch.set_default_dtype(default)
    # parallelize_llama's spmd_types branch, with float64 where it reads
    # TrainingConfig's mixed-precision names (bfloat16 / float32 only).
    validate_config(dims, model)
    model.parallelize(dims)
    dp_mesh, dp_mesh_dims = resolve_fsdp_mesh(dims)
    apply_fsdp_to_decoder(model, dp_mesh, param_dtype=torch.float64, reduce_dtype=torch.float64,
                          pp_enabled=False, dp_mesh_dims=dp_mesh_dims)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model, cfg


def loss_fn(cfg):
    from torchtitan.components.loss import CrossEntropyLoss
    return CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=cfg.vocab_size))


def context(dims):
    """torchtitan's forward/backward context (the spmd_types meshes)."""
    from torchtitan.distributed import utils as dist_utils
    return dist_utils.get_spmd_context(parallel_dims=dims)


def sample_tokens(sample_id, vocab):
    """Sample `sample_id` of the synthetic corpus: SEQ_LEN + 1 token ids, a
    function of the id only (so any data-parallel split reads the same)."""
    g = torch.Generator().manual_seed(1000 + int(sample_id))
    return torch.randint(0, vocab, (SEQ_LEN + 1,), generator=g)
