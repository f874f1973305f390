"""reshard.fsdp against torch's own FSDP (FSDP-1, flat parameters) code on CPU.

The tests drive torch's real `FlatParamHandle` (torch.distributed.fsdp._flat_param),
the part of FullyShardedDataParallel that flattens a wrapped unit and shards it
(`shard()`: torch.chunk and padding), for several world sizes in one process,
and torch.optim.Adam on the local flat shards, and check reshard.fsdp's layout
and a reshard to another world size against them. (Under torch 1.13 on Python
3.11 `torch.distributed.fsdp` did not even import and FSDP needed CUDA; torch 2
runs FullyShardedDataParallel on CPU with gloo, device_id=cpu.)
"""

import numpy as np
import pytest

from reshard import buckets, fsdp, layout

torch = pytest.importorskip("torch")

from torch.distributed.fsdp import _flat_param as flat_param  # noqa: E402


class Group:
    """What FlatParamHandle.shard reads of a process group."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


class Net(torch.nn.Module):
    """Uneven sizes; `block` is a wrapped unit (auto-wrap), the rest the root."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(11, 5)
        self.block = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(),
                                          torch.nn.Linear(7, 5))
        self.head = torch.nn.Linear(5, 3)

    def units(self):
        return fsdp.units_of(self, [self.block])


def handles(net, world, rank):
    """torch's FlatParamHandle of every unit of `net`, sharded for rank."""
    out = {}
    for unit, params in net.units():
        module = net.get_submodule(unit) if unit else net
        h = flat_param.FlatParamHandle(
            [p for _, p in params], module, torch.device("cpu"),
            flat_param.HandleShardingStrategy.FULL_SHARD, offload_params=False,
            mp_param_dtype=None, mp_reduce_dtype=None, keep_low_precision_grads=False,
            process_group=Group(rank, world), use_orig_params=False)
        h.shard()
        out[unit] = h
    return out


def test_units_follow_fsdp_flattening_order():
    net = Net(0)
    units = net.units()
    assert [(u, [n for n, _ in ps]) for u, ps in units] == [
        ("", ["embed.weight", "head.weight", "head.bias"]),
        ("block", ["block.0.weight", "block.0.bias", "block.2.weight", "block.2.bias"])]
    # torch flattens a unit in the same order (names relative to the unit)
    h = handles(Net(0), 1, 0)
    assert list(h["block"].flat_param._fqns) == \
        ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert list(h[""].flat_param._fqns) == ["embed.weight", "head.weight",
                                                            "head.bias"]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_flat_param_shards_are_torchs(world):
    net = Net(1)
    full = {k: v.detach().clone() for k, v in net.state_dict().items()}
    ptc = fsdp.flat_param_ptc(net.units())
    lay = layout.make_layout(1, 1, world, ["h"], world)
    for rank in range(world):
        hs = handles(Net(1), world, rank)
        items = layout.shard(ptc, lay, rank, {k: v.numpy() for k, v in full.items()} |
                             {"optimizer.step": bytes(8)} |
                             {f"optimizer.{s}.{k}": np.zeros(list(v.shape), np.float32)
                              for s in fsdp.ADAM_STATES for k, v in full.items()})
        for unit, h in hs.items():
            local = h.flat_param.detach().numpy()
            assert fsdp.flat_shard_numel(ptc, lay, rank, unit) == local.size
            mine = fsdp.flat_shard_from_items(ptc, lay, rank, unit, items, np.float32)
            assert mine.tobytes() == local.tobytes(), (unit, rank)
            buf = fsdp.flat_buffer(ptc, lay, rank, unit)
            held = sum(m.numel for m in buf.members)
            pad = h.flat_param._shard_numel_padded
            lo, hi = buckets.shard_of(buf, buf.buckets[0])
            assert pad == max(hi, held) - max(lo, held)  # torch's padding, our tail
            back = fsdp.items_from_flat_shard(ptc, lay, rank, unit, h.flat_param)
            assert sorted(back) == sorted(m.name for m in buf.members)
            for name, value in back.items():
                want = items.get(name, np.zeros(0, np.float32))
                assert value.tobytes() == want.tobytes(), (unit, rank, name)


def collect_items(ptc, lay, ranks):
    """{rank: DP_BUCKET items} of every rank's flat params and Adam state."""
    items = {}
    for rank, (hs, opt) in ranks.items():
        items[rank] = {}
        for unit, h in hs.items():
            items[rank] |= fsdp.items_from_flat_shard(ptc, lay, rank, unit, h.flat_param)
            for s in fsdp.ADAM_STATES:
                items[rank] |= fsdp.items_from_flat_shard(ptc, lay, rank, unit,
                                                          opt.state[h.flat_param][s], s)
    return items


def global_from_items(ptc, lay, items_by_rank):
    """Every DP_BUCKET tensor's global value from all ranks' items."""
    out = {}
    for t in ptc.tensors:
        flat = np.zeros(int(np.prod(t.shape)), np.float32)
        for rank, items in items_by_rank.items():
            lo, hi = buckets.member_range(ptc, lay.config, rank, t.name)
            if hi > lo:
                flat[lo:hi] = items[t.name]
        out[t.name] = flat.reshape(list(t.shape))
    return out


def adam_state(net, grads, seed_steps=1):
    """Adam (foreach off) on an unsharded copy of `net`: the full state."""
    opt = torch.optim.Adam(net.parameters(), lr=0.1, foreach=False)
    for _ in range(seed_steps):
        for p in net.parameters():
            p.grad = grads[id(p)]
        opt.step()
    return opt


def run_sharded(net_seed, world, full_grads_by_name, state_items=None, ptc=None, lay=None,
                step=True):
    """Every rank of a flat-parameter job: handles, Adam on the local shards
    with torch's shards of the full gradient; with state_items, each rank's
    flat params and Adam state are first loaded from reshard items."""
    ranks = {}
    for rank in range(world):
        net = Net(net_seed)
        hs = handles(net, world, rank)
        flats = [h.flat_param for h in hs.values()]
        opt = torch.optim.Adam(flats, lr=0.1, foreach=False)
        for unit, h in hs.items():
            flat = h.flat_param
            if state_items is not None:
                items = state_items[rank]
                with torch.no_grad():
                    flat.copy_(torch.from_numpy(fsdp.flat_shard_from_items(
                        ptc, lay, rank, unit, items, np.float32)))
                opt.state[flat] = {"step": torch.tensor(1.0)} | {
                    s: torch.from_numpy(fsdp.flat_shard_from_items(ptc, lay, rank, unit, items,
                                                                   np.float32, s))
                    for s in fsdp.ADAM_STATES}
            names = [n for u, ps in Net(0).units() if u == unit for n, _ in ps]
            full_grad = torch.cat([full_grads_by_name[n].reshape(-1) for n in names])
            flat.grad, _ = flat_param.FlatParamHandle._get_shard(full_grad, rank, world)
        if step:
            opt.step()
        ranks[rank] = (hs, opt)
    return ranks


def unshard(ranks, unit):
    """The unit's full flat parameter and Adam state, from every rank."""
    hs0 = ranks[0][0][unit].flat_param
    n = hs0._unpadded_unsharded_size.numel()
    params = torch.cat([ranks[r][0][unit].flat_param.detach() for r in sorted(ranks)])[:n]
    state = {s: torch.cat([ranks[r][1].state[ranks[r][0][unit].flat_param][s]
                           for r in sorted(ranks)])[:n] for s in fsdp.ADAM_STATES}
    return params, state


def test_round_trip_to_another_world_size():
    """World 2: one Adam step on torch's flat shards; describe the shards with
    reshard.fsdp, reshard to world 3 by the reference layout, load them into
    new handles (a model initialised differently), compare with the full state
    dict and the full Adam state, then take one more step on both."""
    ref = Net(5)
    grads = {id(p): torch.randn_like(p) for p in ref.parameters()}
    by_name = {n: grads[id(p)] for n, p in ref.named_parameters()}
    full_opt = adam_state(ref, grads)
    old = run_sharded(5, 2, by_name)
    ptc = fsdp.flat_param_ptc(ref.units())
    old_lay = layout.make_layout(1, 1, 2, ["h"], 2)
    g = global_from_items(ptc, old_lay, collect_items(ptc, old_lay, old))
    g["optimizer.step"] = bytes(8)
    new_lay = layout.make_layout(1, 1, 3, ["h"], 3)
    new_items = {r: layout.shard(ptc, new_lay, r, g) for r in range(3)}
    grads2 = {id(p): torch.randn_like(p) for p in ref.parameters()}
    by_name2 = {n: grads2[id(p)] for n, p in ref.named_parameters()}
    # loaded at world 3 into a model initialised from another seed: the full
    # state dict and the full Adam state, byte for byte
    loaded = run_sharded(9, 3, by_name2, new_items, ptc, new_lay, step=False)
    compare(loaded, ref, full_opt)
    # and one more step at world 3 equals one more step of the full model
    new = run_sharded(9, 3, by_name2, new_items, ptc, new_lay)
    for p in ref.parameters():
        p.grad = grads2[id(p)]
    full_opt.step()
    compare(new, ref, full_opt)


def compare(ranks, ref, full_opt):
    for unit, params in ref.units():
        flat, state = unshard(ranks, unit)
        want = torch.cat([p.detach().reshape(-1) for _, p in params])
        assert flat.numpy().tobytes() == want.numpy().tobytes(), unit
        for s in fsdp.ADAM_STATES:
            want = torch.cat([full_opt.state[p][s].reshape(-1) for _, p in params])
            assert state[s].numpy().tobytes() == want.numpy().tobytes(), (unit, s)


def test_loaded_state_equals_the_full_state_dict():
    """Right after loading at world 3 (no step): unsharded = state_dict."""
    ref = Net(6)
    grads = {id(p): torch.randn_like(p) for p in ref.parameters()}
    by_name = {n: grads[id(p)] for n, p in ref.named_parameters()}
    adam_state(ref, grads)
    old = run_sharded(6, 2, by_name)
    ptc = fsdp.flat_param_ptc(ref.units())
    old_lay, new_lay = (layout.make_layout(1, 1, w, ["h"], w) for w in (2, 3))
    g = global_from_items(ptc, old_lay, collect_items(ptc, old_lay, old))
    full = ref.state_dict()
    for name, value in full.items():
        assert g[name].tobytes() == value.numpy().tobytes(), name
    for r in range(3):
        hs = handles(Net(8), 3, r)
        got = layout.shard(ptc, new_lay, r, g | {"optimizer.step": bytes(8)})
        for unit, h in hs.items():
            torch_shard, _ = flat_param.FlatParamHandle._get_shard(
                torch.cat([full[n].reshape(-1) for u, ps in ref.units() if u == unit
                           for n, _ in ps]), r, 3)
            mine = fsdp.flat_shard_from_items(ptc, new_lay, r, unit, got, np.float32)
            assert mine.tobytes() == torch_shard.numpy().tobytes(), (unit, r)


def test_dtensor_ptc_is_torch_chunk_per_parameter():
    net = Net(2)
    ptc = fsdp.dtensor_ptc(dict(net.named_parameters()))
    t = next(t for t in ptc.tensors if t.name == "embed.weight")
    assert (t.partition.dp.axis, t.partition.allow_empty) == (0, True)
    lay = layout.make_layout(1, 1, 4, ["h"], 4)
    g = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    for s in fsdp.ADAM_STATES:
        g |= {f"optimizer.{s}.{k}": np.zeros(v.shape, np.float32) for k, v in g.items()
              if not k.startswith("optimizer.")}
    g["optimizer.step"] = bytes(8)
    for r in range(4):
        got = layout.shard(ptc, lay, r, g)
        for name, p in net.named_parameters():
            chunks = p.detach().chunk(4, dim=0)
            want = chunks[r] if r < len(chunks) else None
            if want is None or want.numel() == 0:
                assert name not in got
            else:
                assert got[name].tobytes() == want.numpy().tobytes(), (name, r)
