"""Specs: exact parameter counts, presets, loading, validation, placement."""

import json
import subprocess
import sys

import pytest

from ptd.errors import PtdError
from ptd.specs import (ClusterSpec, ParallelPlan, TrainConfig, config_from_dict,
                       get_preset, load_config, load_hardware, load_model)
from ptd.specs import layout
from ptd.specs.model import PRESETS

# Published parameter counts (model cards / config.json + safetensors index totals).
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-355m": 354_823_168,
    "gpt2-774m": 774_030_080,
    "gpt2-1.5b": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_published_parameter_counts(name, count):
    assert get_preset(name).param_count() == count


def test_gpt3_is_175b():
    # OpenAI reports "175B"; the exact count of the published shape is 174.6B.
    assert abs(get_preset("gpt3-175b").param_count() / 175e9 - 1) < 0.003


def test_every_preset_has_a_count():
    assert len(PRESETS) >= 15
    for m in PRESETS.values():
        assert m.param_count() > 0


def test_moe_active_params_fewer_than_total():
    m = get_preset("mixtral-8x7b")
    # Mixtral's published "active parameters per token": 12.9B (incl. embeddings).
    active = m.matmul_params(active=True) + m.vocab_size * m.hidden
    assert abs(active / 12.9e9 - 1) < 0.01
    assert m.matmul_params(active=False) > 3 * m.matmul_params(active=True)


def test_hf_config_llama_and_gpt2(tmp_path):
    llama = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
             "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
             "rope_theta": 500000.0, "tie_word_embeddings": False}
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "config.json").write_text(json.dumps(llama))
    m = load_model(str(tmp_path / "l"))
    assert m.param_count() == PUBLISHED["llama3-8b"]
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "n_positions": 1024}
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps(gpt2))
    assert load_model(str(p)).param_count() == PUBLISHED["gpt2"]


def test_model_from_toml(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[model]\npreset = "llama2-7b"\nn_layers = 16\n')
    m = load_model(str(p))
    assert m.n_layers == 16 and m.hidden == 4096
    p.write_text('[model]\nbogus = 1\n')
    with pytest.raises(PtdError, match="unknown model field"):
        load_model(str(p))


@pytest.mark.parametrize("ref,msg", [
    ("nope", "unknown model preset"),
    ("/nonexistent/x.toml", "not found"),
])
def test_model_bad_refs(ref, msg):
    with pytest.raises(PtdError, match=msg):
        load_model(ref)


def test_model_validation():
    with pytest.raises(PtdError, match="multiple of n_kv_heads"):
        get_preset("tiny").replace(n_kv_heads=3)
    with pytest.raises(PtdError, match="positive integer"):
        get_preset("tiny").replace(n_layers=0)


def test_hardware_presets_dense_not_sparse():
    h = load_hardware("h100-sxm")
    assert h.peak("bf16") == pytest.approx(989.4e12)
    assert h.sparse_peak_flops["bf16"] == pytest.approx(2 * 989.4e12)
    # The one H100 reading: 8192^3 bf16 matmul at ~798 TFLOP/s of 989 dense.
    assert abs(h.gemm_rate("bf16") / 798e12 - 1) < 0.02
    for name in ["v100", "a100-40g", "a100-80g", "h100-sxm", "h200", "b200", "mi300x",
                 "ascend-910b", "cpu"]:
        hw = load_hardware(name)
        assert hw.sources, name


def test_hardware_from_toml(tmp_path):
    p = tmp_path / "mygpu.toml"
    p.write_text('[hardware]\npreset = "a100-80g"\nmemory_bytes = 4.0e10\n'
                 '[hardware.inter_node]\nbandwidth = 1e10\nlatency = 2e-5\n')
    h = load_hardware(str(p))
    assert h.memory_bytes == 4e10 and h.inter_node.bandwidth == 1e10
    assert h.peak("bf16") == 312e12


def test_cpu_rate_shared_between_workers():
    cpu = load_hardware("cpu")
    r = {n: cpu.gemm_rate("fp32", n) for n in (1, 2, 3, 4, 8)}
    assert r[1] >= r[2] >= r[3] >= r[4] > r[8]  # more workers never run faster
    assert r[4] == pytest.approx(r[2] / 2, rel=0.1)  # 4 workers share 2 cores
    assert r[8] == pytest.approx(r[4] / 2)  # past the last measurement: shared out
    assert cpu.op_overhead_at(8) == pytest.approx(2 * cpu.op_overhead_at(4))


def test_blocking_wait_curve_lookup_and_toml(tmp_path):
    """``blocking_wait_measured``: linear between the measured chunks, flat outside them,
    the nearest worker count at or above the one asked, grown as workers past the largest;
    a profile without it falls back to the old single ``blocking_collective`` wait."""
    base = load_hardware("cpu").replace(blocking_wait_measured={})
    hw = base.replace(blocking_wait_measured={2: ((0.0, 1e-3), (0.01, 3e-3)),
                                              4: ((0.001, 2e-3), (0.02, 6e-3))})
    assert hw.blocking_wait_at(0.005, 2) == pytest.approx(2e-3)  # halfway
    assert hw.blocking_wait_at(1.0, 2) == pytest.approx(3e-3)  # flat past the last chunk
    assert hw.blocking_wait_at(0.0, 3) == pytest.approx(2e-3)  # 3 -> the 4-worker curve
    assert hw.blocking_wait_at(0.0105, 4) == pytest.approx(4e-3)
    assert hw.blocking_wait_at(0.0105, 8) == pytest.approx(8e-3)  # 8 workers: twice 4's
    assert ClusterSpec(hw, 4).blocking_wait(0.0105) == pytest.approx(4e-3)
    assert base.blocking_wait_at(0.01, 4) == 0.0
    old = base.replace(overheads_measured={"blocking_collective": {2: 1e-3, 4: 2e-3}})
    assert old.blocking_wait_at(0.01, 4) == 2e-3 and old.blocking_wait_at(0.0, 2) == 1e-3
    assert load_hardware("h100-sxm").blocking_wait_at(0.01, 8) == 0.0
    p = tmp_path / "box.toml"
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.blocking_wait_measured]\n'
                 '2 = [[0.0, 0.001], [0.01, 0.003]]\n')
    assert load_hardware(str(p)).blocking_wait_measured == {2: ((0.0, 1e-3), (0.01, 3e-3))}
    assert hw.to_dict()["blocking_wait_measured"]["2"] == [[0.0, 1e-3], [0.01, 3e-3]]
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.blocking_wait_measured]\n2 = 0.001\n')
    with pytest.raises(PtdError, match="blocking_wait_measured"):
        load_hardware(str(p))
    with pytest.raises(PtdError, match=r"wait must be >= 0, got -0.001"):
        base.replace(blocking_wait_measured={2: ((0.0, -1e-3),)})


def test_blocking_wait_of_a_larger_group_reads_its_own_curve(tmp_path):
    """``blocking_wait_group_measured``: a collective of a group of at least a measured
    size reads that size's curve (the largest not above it), grown as workers past it;
    pairs and groups smaller than any measured read the pairs' curve."""
    base = load_hardware("cpu").replace(
        blocking_wait_measured={2: ((0.0, 1e-3), (0.01, 3e-3)),
                                4: ((0.001, 2e-3), (0.02, 6e-3))})
    hw = base.replace(blocking_wait_group_measured={4: ((0.0, 5e-3), (0.01, 9e-3))})
    assert hw.blocking_wait_at(0.005, 4, 4) == pytest.approx(7e-3)  # the group's, halfway
    assert hw.blocking_wait_at(0.005, 4, 6) == pytest.approx(7e-3)  # 6: the largest <= 6
    assert hw.blocking_wait_at(0.005, 8, 8) == pytest.approx(14e-3)  # 8 workers: twice 4's
    assert hw.blocking_wait_at(0.005, 2, 2) == pytest.approx(2e-3)  # a pair: the pairs'
    assert hw.blocking_wait_at(0.0105, 4, 3) == pytest.approx(4e-3)  # 3 < 4: the pairs' N=4
    assert hw.blocking_wait_at(0.0105, 4) == pytest.approx(4e-3)  # default group: a pair
    assert ClusterSpec(hw, 4).blocking_wait(0.005, 4) == pytest.approx(7e-3)
    p = tmp_path / "box.toml"
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.blocking_wait_group_measured]\n'
                 '4 = [[0.0, 0.005], [0.01, 0.009]]\n')
    assert load_hardware(str(p)).blocking_wait_group_measured == {
        4: ((0.0, 5e-3), (0.01, 9e-3))}
    assert hw.to_dict()["blocking_wait_group_measured"]["4"] == [[0.0, 5e-3], [0.01, 9e-3]]
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.blocking_wait_group_measured]\n4 = 1\n')
    with pytest.raises(PtdError, match="blocking_wait_group_measured"):
        load_hardware(str(p))
    with pytest.raises(PtdError, match="blocking_wait_group_measured"):
        base.replace(blocking_wait_group_measured={2: ((0.0, 1e-3),)})  # a pair: the other
    with pytest.raises(PtdError, match="wait must be >= 0"):
        base.replace(blocking_wait_group_measured={4: ((0.0, -1e-3),)})


def test_dtensor_reduce_lookup_and_toml(tmp_path):
    """``dtensor_reduce_measured``: the least-squares line through the points, never below
    0, the worker count picked as the blocking curve's; 0 where absent (presets, GPUs)."""
    base = load_hardware("cpu")
    assert base.dtensor_reduce_at(2**21, 2) == 0.0
    assert load_hardware("h100-sxm").dtensor_reduce_at(2**21, 8) == 0.0
    # (1e6, 1 ms), (2e6, 2.5 ms), (3e6, 3 ms): mean (2e6, 2.1667 ms); slope
    # ((-1e6)(-1.1667e-3) + 0 + (1e6)(0.8333e-3)) / 2e12 = 1e-9 s per byte
    hw = base.replace(dtensor_reduce_measured={2: ((1e6, 1e-3), (2e6, 2.5e-3), (3e6, 3e-3)),
                                               4: ((1e6, 5e-3),)})
    assert hw.dtensor_reduce_at(2e6, 2) == pytest.approx(2.5e-3 / 3 + 1e-3 / 3 + 1e-3)
    assert hw.dtensor_reduce_at(4e6, 2) == pytest.approx(6.5e-3 / 3 + 2e-3)
    assert hw.dtensor_reduce_at(0.0, 2) == pytest.approx(6.5e-3 / 3 - 2e-3)  # 0.1667 ms
    assert hw.dtensor_reduce_at(1e9, 4) == 5e-3  # one point: flat
    assert hw.dtensor_reduce_at(1e6, 3) == 5e-3  # 3 -> the 4-worker points
    assert ClusterSpec(hw, 4).dtensor_reduce(1e6) == 5e-3
    falling = base.replace(dtensor_reduce_measured={2: ((1e6, 2e-3), (2e6, 1e-3))})
    assert falling.dtensor_reduce_at(1e7, 2) == 0.0  # the line goes below 0: nothing
    p = tmp_path / "box.toml"
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.dtensor_reduce_measured]\n'
                 '2 = [[65536, 0.0005], [1048576, 0.001]]\n')
    assert load_hardware(str(p)).dtensor_reduce_measured == {
        2: ((65536.0, 5e-4), (1048576.0, 1e-3))}
    assert hw.to_dict()["dtensor_reduce_measured"]["4"] == [[1e6, 5e-3]]
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.dtensor_reduce_measured]\n2 = 0.001\n')
    with pytest.raises(PtdError, match="dtensor_reduce_measured"):
        load_hardware(str(p))
    with pytest.raises(PtdError, match="dtensor_reduce_measured"):
        base.replace(dtensor_reduce_measured={2: ((1e6, -1e-3),)})
    with pytest.raises(PtdError, match="dtensor_reduce_measured"):
        base.replace(dtensor_reduce_measured={2: ()})


def test_cluster_nodes():
    c = ClusterSpec(load_hardware("h100-sxm"), 64)
    assert c.n_nodes == 8 and c.devices_per_node == 8
    with pytest.raises(PtdError, match="whole nodes"):
        ClusterSpec(load_hardware("h100-sxm"), 12)


# ----------------------------------------------------------------- plans
tiny = get_preset("tiny")


@pytest.mark.parametrize("plan,world,msg", [
    (ParallelPlan(dp=2, tp=2), 8, "does not equal the world size 8"),
    (ParallelPlan(tp=3), None, "not divisible by tp 3"),
    (ParallelPlan(tp=8), None, "key/value heads are not divisible by tp 8"),
    (ParallelPlan(pp=3), None, "layers are not divisible by pp = 3"),
    (ParallelPlan(pp=2, vpp=4, schedule="interleaved-1f1b", global_batch=8), None,
     "cannot fill pp\\*vpp = 2\\*4 stages"),
    (ParallelPlan(dp=3, global_batch=8), None, "not divisible by micro-batch\\*dp"),
    (ParallelPlan(pp=4, global_batch=2, schedule="1f1b"), None, "at least pp = 4 micro-batches"),
    (ParallelPlan(pp=2, vpp=1, schedule="interleaved-1f1b"), None, "needs vpp > 1"),
    (ParallelPlan(pp=2, vpp=2, schedule="1f1b"), None, "one stage per rank"),
    (ParallelPlan(vpp=2), None, "needs pp > 1"),
    (ParallelPlan(sp=True), None, "needs tp > 1"),
    (ParallelPlan(zero=4), None, "zero must be"),
    (ParallelPlan(recompute="most"), None, "recompute must be"),
    (ParallelPlan(dtype="fp64"), None, "dtype must be"),
    (ParallelPlan(micro_batch=0), None, "positive integer"),
    (ParallelPlan(seq_len=100000), None, "exceeds"),
    (ParallelPlan(offload=True), None, "offload needs zero 3"),
    (ParallelPlan(zero=1, grad_compression="fp16"), None, "DDP only"),
])
def test_plan_validation_one_line(plan, world, msg):
    with pytest.raises(PtdError, match=msg) as e:
        plan.validate(tiny, world)
    assert "\n" not in str(e.value)


def test_uneven_stages_opt_in():
    m = get_preset("llama3.1-405b")
    published = ParallelPlan(dp=128, tp=8, pp=16, global_batch=2048, seq_len=8192)
    with pytest.raises(PtdError, match="126 layers are not divisible by pp = 16"):
        published.validate(m, 16384)
    published.replace(uneven_stages=True).validate(m, 16384)
    from ptd.specs.stages import stage_split
    split = stage_split(m, 16, 8192)
    assert sum(split) == 126 and split[0] == split[-1] == 7 and set(split[1:-1]) == {8}
    with pytest.raises(PtdError, match="cannot fill"):
        ParallelPlan(pp=8, uneven_stages=True, global_batch=8).validate(tiny)


def test_plan_derived():
    p = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=2, global_batch=16)
    p.validate(tiny, 8)
    assert p.world_size == 8 and p.n_microbatches == 4
    zb = ParallelPlan(pp=2, schedule="zero-bubble", global_batch=4)
    assert zb.stages_per_rank == 2 and zb.n_stages == 4
    zb.validate(tiny)


def test_layout_tp_innermost_then_dp_then_pp():
    p = ParallelPlan(dp=2, tp=2, pp=2)
    assert layout.coords(0, p) == {"pp": 0, "dp": 0, "cp": 0, "tp": 0}
    assert layout.coords(1, p) == {"pp": 0, "dp": 0, "cp": 0, "tp": 1}
    assert layout.coords(2, p) == {"pp": 0, "dp": 1, "cp": 0, "tp": 0}
    assert layout.coords(4, p) == {"pp": 1, "dp": 0, "cp": 0, "tp": 0}
    assert layout.groups("tp", p) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp", p) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp", p) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for r in range(8):
        c = layout.coords(r, p)
        assert layout.rank_of(c["pp"], c["dp"], c["tp"], p) == r
    # tp 8 inside a node of 8; dp 4 then spans 4 nodes with one member each.
    big = ParallelPlan(dp=4, tp=8, pp=2)
    assert layout.axis_node_split("tp", big, 8) == (1, 8)
    assert layout.axis_node_split("dp", big, 8) == (4, 1)
    assert layout.axis_node_split("dp", ParallelPlan(dp=16, tp=2), 8) == (4, 4)


def test_layout_cp_between_dp_and_tp():
    # (pp, dp, cp, tp) row-major, 16 ranks: tp neighbours 1 apart, cp 2, dp 4, pp 8
    p = ParallelPlan(dp=2, cp=2, tp=2, pp=2)
    assert p.world_size == 16
    assert layout.coords(2, p) == {"pp": 0, "dp": 0, "cp": 1, "tp": 0}
    assert layout.coords(13, p) == {"pp": 1, "dp": 1, "cp": 0, "tp": 1}
    assert layout.group_of(0, "cp", p) == [0, 2]
    assert layout.group_of(0, "dp", p) == [0, 4]
    assert layout.group_of(0, "pp", p) == [0, 8]
    assert layout.group_of(5, "cp", p) == [5, 7]
    for r in range(16):
        c = layout.coords(r, p)
        assert layout.rank_of(c["pp"], c["dp"], c["tp"], p, c["cp"]) == r


# ----------------------------------------------------------------- config
def test_train_config_toml_roundtrip(tmp_path):
    c = TrainConfig().replace(steps=7, seed=3)
    c = c.replace(plan=c.plan.replace(dp=2, tp=2, sp=True))
    path = tmp_path / "config.toml"
    c.save(path)
    back = load_config(path)
    assert back == c


def test_train_config_overlay_and_errors():
    c = config_from_dict({"model": {"preset": "tiny"}, "plan": {"dp": 2}, "optim": {"lr": 1e-2},
                          "steps": 5})
    assert c.model == get_preset("tiny") and c.plan.dp == 2 and c.optim.lr == 1e-2 and c.steps == 5
    with pytest.raises(PtdError, match="unknown config field"):
        config_from_dict({"stepz": 5})
    with pytest.raises(PtdError, match=r"\[optim\]: unknown field"):
        config_from_dict({"optim": {"lrr": 1}})
    TrainConfig().validate(4)
    with pytest.raises(PtdError, match="world size 2"):
        TrainConfig().validate(2)


def test_specs_and_cost_never_import_torch():
    code = ("import sys, ptd.specs, ptd.cost, ptd.planner, ptd.cli, ptd.commands;"
            "from ptd.cli import build_parser; build_parser();"
            "import pkgutil, importlib, ptd.cost as c, ptd.planner as p;"
            "[importlib.import_module(m.name) for pkg in (c, p) for m in "
            "pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.')];"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
