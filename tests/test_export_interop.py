"""Every export of a set of plans, fed to the frameworks' own code as a user would run it:
DeepSpeed 0.19.8's ``DeepSpeedConfig`` reads the ds_config file, torchtitan 0.3.0's
``ConfigManager`` parses the launch script's arguments (and ``ParallelDims`` checks the
degrees against the world), megatron-core's ``TransformerConfig`` is built from the Megatron
launch script's arguments. What they parsed must be the plan.

The frameworks live in .venv-interop (``scripts/setup --interop``; the default
``scripts/setup`` builds it, cached), so these tests always run; one subprocess checks all
exports (tests/interop/check_exports.py). Megatron-LM's own ``parse_args``/``validate_args``
(core_r0.19.0) are not in megatron-core's wheel: tests/interop/megatron_validate_args.py
runs them from a checkout, by hand (docs/exports.md).
"""

import json
import subprocess
from pathlib import Path

import pytest

from helpers import export_spread
from ptd.planner import export_torchtitan
from ptd.planner.export import export_files, launch_filename, stages
from ptd.planner.search import search
from ptd.specs import ClusterSpec, TrainConfig, get_preset, load_hardware

ROOT = Path(__file__).resolve().parents[1]
INTEROP_PY = ROOT / ".venv-interop" / "bin" / "python"

# name: (model, H100s, global batch, seq len, fixed plan fields)
PLANS = {
    "zero1-dp16-tp2": ("llama3-8b", 32, 64, 2048, {"dp": 16, "tp": 2, "zero": 1}),
    "zero2-dp32": ("llama3-8b", 32, 64, 2048, {"dp": 32, "zero": 2}),
    "zero3-dp32": ("llama3-8b", 32, 64, 2048, {"dp": 32, "zero": 3}),
    "zero3-offload": ("llama3-8b", 32, 64, 2048, {"dp": 32, "zero": 3, "offload": True}),
    "pure-tp8": ("llama3-8b", 8, 8, 4096, {"tp": 8, "dp": 1, "zero": 0}),
    "tp2-pp2-vpp2": ("llama3-8b", 16, 64, 8192, {"tp": 2, "pp": 2, "vpp": 2, "zero": 1,
                                                 "schedule": "interleaved-1f1b"}),
    "uneven-pp3": ("llama3-8b", 24, 48, 8192, {"tp": 2, "pp": 3, "schedule": "1f1b",
                                               "uneven_stages": True}),
    "70b-pp4-full": ("llama3-70b", 64, 256, 8192, {"tp": 8, "pp": 4, "schedule": "1f1b",
                                                   "recompute": "full"}),
    "405b-pp16": ("llama3.1-405b", 2048, 2048, 8192, {"tp": 8, "pp": 16, "schedule": "1f1b",
                                                      "uneven_stages": True, "zero": 1}),
    # mixture of experts (expert parallelism runs with ZeRO 0 in ptd) and context parallel
    "mixtral-ep8-pp4": ("mixtral-8x7b", 64, 256, 4096, {"ep": 8, "tp": 1, "pp": 4, "zero": 0,
                                                        "schedule": "1f1b"}),
    "mixtral-tp2-ep4": ("mixtral-8x7b", 64, 256, 4096, {"ep": 4, "tp": 2, "pp": 4, "zero": 0,
                                                        "schedule": "1f1b"}),
    "tiny-moe-ep4": ("tiny-moe", 8, 16, 256, {"ep": 4, "dp": 8}),
    "cp2-tp2": ("llama3-8b", 16, 32, 8192, {"cp": 2, "tp": 2}),
    "70b-cp2-pp4": ("llama3-70b", 128, 64, 8192, {"cp": 2, "tp": 8, "pp": 4, "schedule": "1f1b"}),
}
FILES = {"deepspeed": "ds_config.json", "torchtitan": "torchtitan_launch.sh",
         "megatron": "megatron_launch.sh"}
OPT = TrainConfig().optim  # what ptd train would run: the exports carry the same schedule
AC = {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """{name: (estimate, {framework: result}, folder)} for every plan of the set and of
    helpers.EXPORT_SPREAD (named ``spread-NN``): one subprocess reads all their exports."""
    assert INTEROP_PY.exists(), "run scripts/setup (it builds .venv-interop)"
    d = tmp_path_factory.mktemp("exports")
    ests = {name: search(get_preset(model), ClusterSpec(load_hardware("h100-sxm"), n, 0), gb,
                         seq, dtype="bf16", fixed=fix).best
            for name, (model, n, gb, seq, fix) in PLANS.items()}
    ests |= {f"spread-{i:02d}": e for i, e in enumerate(export_spread())}
    manifest = []
    for name, e in ests.items():
        item = {"name": name, "world_size": e.plan.world_size, "dp": e.plan.dp}
        for fw, fname in FILES.items():
            ex = export_files(e, fw, name=f"{name}.{fname}")
            (d / f"{name}.{fname}").write_text(ex.text)
            for other, text in ex.beside.items():
                (d / other).write_text(text)
            item[fw] = str(d / f"{name}.{fname}")
        manifest.append(item)
    (d / "manifest.json").write_text(json.dumps(manifest))
    r = subprocess.run([str(INTEROP_PY), str(ROOT / "tests/interop/check_exports.py"),
                        str(d / "manifest.json"), str(d / "out.json")],
                       capture_output=True, text=True, timeout=280,
                       env={"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu",
                            "OMP_NUM_THREADS": "1", "HOME": str(d)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((d / "out.json").read_text())
    for what, names in (("plans", list(PLANS)), ("spread plans", [k for k in ests if k not in PLANS])):
        accepted = {fw: sum(out[k][fw]["ok"] for k in names) for fw in FILES}
        print(f"\nEXPORTS ACCEPTED of {len(names)} {what}: {accepted}")
    return {k: (ests[k], out[k], d) for k in ests}


@pytest.fixture(scope="module")
def checked(fed):
    """The named set's part of ``fed``."""
    return {k: v for k, v in fed.items() if k in PLANS}


def _ok(res, fw, name):
    assert res[fw]["ok"], f"{fw} refused the {name} export: {res[fw]['error']}"
    return res[fw]["parsed"]


@pytest.mark.timeout(300)
def test_the_set_covers_what_the_issue_names(checked):
    ps = {k: e.plan for k, (e, _, _) in checked.items()}
    assert {p.zero for p in ps.values()} == {0, 1, 2, 3}
    assert any(p.offload for p in ps.values()) and any(p.vpp > 1 for p in ps.values())
    assert any(p.tp > 1 and p.dp == 1 and p.pp == 1 for p in ps.values())
    assert any(p.uneven_stages and len(set(stages(checked[k][0]))) > 1 for k, p in ps.items())
    assert ps["405b-pp16"].pp == 16 and checked["405b-pp16"][0].model.n_layers == 126
    assert any(p.ep > 1 and p.tp > 1 for p in ps.values()) and any(p.ep > 1 for p in ps.values())
    assert any(p.cp > 1 and p.pp > 1 for p in ps.values()) and any(p.cp > 1 for p in ps.values())
    assert ps["mixtral-ep8-pp4"].ep == 8 and checked["mixtral-ep8-pp4"][0].model.n_experts == 8


@pytest.mark.timeout(300)
def test_deepspeed_reads_the_plan(checked):
    for name, (e, res, d) in checked.items():
        p, got, m = e.plan, _ok(res, "deepspeed", name), e.model
        assert got["train_batch_size"] == p.global_batch and got["micro_batch"] == p.micro_batch
        assert got["grad_accum"] == p.global_batch // (p.micro_batch * p.dp) and got["dp"] == p.dp
        assert got["zero"] == p.zero and got["bf16"] and not got["fp16"]
        assert got["offload_optimizer"] == p.offload
        assert got["offload_param"] == (p.offload and p.zero == 3)
        assert got["optimizer"] == "adamw" and got["scheduler"] == "WarmupCosineLR"
        assert got["total_steps"] == 200  # ptd train's default steps, as `ptd plan --help` says
        assert (got["lr"], got["warmup"], got["min_lr_ratio"]) == (OPT.lr, OPT.warmup_steps,
                                                                   OPT.min_lr_ratio)
        # the plain JSON has no wrapper; what it cannot hold is in the launch script beside it
        ds = json.loads((d / f"{name}.ds_config.json").read_text())
        assert "train_batch_size" in ds and "ds_config" not in ds
        launch = (d / launch_filename(f"{name}.ds_config.json")).read_text()
        assert f"--deepspeed_config {name}.ds_config.json" in launch
        if p.pp > 1:
            assert f"num_stages={p.pp}" in launch and "not expressible" in launch
        assert got["moe"] == ({"hidden_size": m.hidden, "expert": None,
                               "num_experts": m.n_experts, "ep_size": p.ep, "k": m.top_k,
                               "drop_tokens": False} if m.is_moe else None)
        if m.is_moe:  # experts and ep are the model code's: named, with the values
            want = f"deepspeed.moe.layer.MoE(hidden_size={m.hidden}, expert=<the MLP>, " \
                   f"num_experts={m.n_experts}, ep_size={p.ep}, k={m.top_k}, drop_tokens=False)"
            assert want in launch, launch
            assert f"# not expressible: the {m.n_experts} experts (top-{m.top_k} routing) and " \
                   f"expert parallelism ep {p.ep} have no ds_config key" in launch
        if p.cp > 1:
            assert f" x context {p.cp} x " in launch
            assert "# not expressible: context parallelism" in launch


@pytest.mark.timeout(300)
def test_torchtitan_parses_the_plan(checked):
    for name, (e, res, d) in checked.items():
        p, got = e.plan, _ok(res, "torchtitan", name)
        script = (d / f"{name}.torchtitan_launch.sh").read_text()
        if e.model.name.startswith("llama3"):
            assert got["n_layers"] == e.model.n_layers  # the config function is the ptd model
        else:  # no config function of this shape: named, with the shape to register
            assert f"# not expressible: {e.model.name} has no torchtitan config function" in script
            assert f"n_layers={e.model.n_layers}" in script
        if e.model.is_moe:  # a module with experts, so that expert parallelism applies
            assert got["num_experts"] and got["no_cuda_graphs"]
            assert f"num_experts={e.model.n_experts}, top_k={e.model.top_k}" in script
        assert got["ep"] == p.ep and got["cp"] == p.cp
        if p.cp > 1:
            assert got["cp_balancer"] == "headtail"  # ptd's zig-zag chunks
        assert got["dp_replicate"] * got["dp_shard"] == p.dp
        assert (got["tp"], got["pp"]) == (p.tp, p.pp)
        if got["dp_shard"] > 1:
            assert got["reshard"] == ("always" if p.zero == 3 else "never")
        if p.tp > 1:
            assert got["sp"] == p.sp
        assert got["global_batch"] == p.global_batch and got["seq_len"] == p.seq_len
        assert got["steps"] == 200 and got["param_dtype"] == "bfloat16"
        assert got["offload"] == p.offload and got["ac"] == AC[p.recompute]
        assert got["warmup"] == 20 and got["min_lr_factor"] == 0.1 and got["lr"] == OPT.lr
        if p.pp > 1:
            assert got["schedule"] == export_torchtitan.schedule(p)
        if p.pp > 1:
            assert got["no_cuda_graphs"] and got["pp_microbatch"] == p.micro_batch
            assert got["local_batch"] // got["pp_microbatch"] == p.n_microbatches
            parts = got["parts"]
            want = ["tok_embeddings"] + [f"layers.{i}" for i in range(e.model.n_layers)]
            assert sum(parts, []) == want + ["norm", "lm_head"]  # every module once, in order
            assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(stages(e))
        else:
            assert got["global_batch"] // (got["local_batch"] * p.dp) == p.n_microbatches


@pytest.mark.timeout(300)
def test_megatron_core_builds_the_plan(checked):
    for name, (e, res, d) in checked.items():
        p, got = e.plan, _ok(res, "megatron", name)
        assert (got["tp"], got["pp"], got["dp"]) == (p.tp, p.pp, p.dp)
        assert got["vpp"] == (p.stages_per_rank if p.stages_per_rank > 1 else None)
        assert got["sp"] == (p.sp and p.tp > 1) and got["num_layers"] == e.model.n_layers
        assert got["recompute"] == (None if p.recompute == "none" else p.recompute)
        if p.pp > 1:
            assert got["layout_stages"] == list(stages(e))
            assert sum(got["layout_stages"]) == e.model.n_layers
        assert (got["micro_batch"], got["global_batch"]) == (p.micro_batch, p.global_batch)
        # Megatron pads --vocab-size to a multiple of make-vocab-size-divisible-by * tp: the
        # rows ptd's runtime allocates (128 x tp by default)
        m = got["vocab_divisible_by"] * p.tp
        assert -(-got["vocab"] // m) * m == e.model.padded_vocab(p.tp)
        assert got["vocab"] == e.model.vocab_size
        assert got["fsdp"] == (p.zero >= 2)
        if p.zero >= 2:
            assert got["ckpt_format"] == "fsdp_dtensor"
            assert got["sharding"] == {2: "optim_grads", 3: "optim_grads_params"}[p.zero]
        assert got["dist_opt"] == (p.zero == 1 or p.offload)
        assert got["offload"] == got["precision_aware"] == p.offload
        # set whenever Megatron-FSDP (which wants it unset) is not used: tp > 1 needs it
        assert got["max_connections_1"] == (p.zero < 2)
        assert got["train_iters"] == 200 and got["bf16"]
        assert (got["lr"], got["warmup"], got["decay"]) == (OPT.lr, OPT.warmup_steps, "cosine")
        assert got["min_lr"] == pytest.approx(OPT.lr * OPT.min_lr_ratio)
        assert got["cp"] == p.cp and got["cp_comm"] == ("all_gather" if p.cp > 1 else None)
        m = e.model
        if m.is_moe:
            assert (got["num_experts"], got["topk"], got["ep"]) == (m.n_experts, m.top_k, p.ep)
            assert got["moe_ffn"] == m.ffn_hidden and got["aux_coeff"] == m.aux_loss_coef
            assert got["z_coeff"] == m.z_loss_coef and got["capacity"] is None  # dropless
            # Megatron shards experts over tp by default; ptd does not: named
            assert got["etp"] == p.tp
            if p.tp > 1:
                assert "# not expressible: experts over tp" in \
                    (d / f"{name}.megatron_launch.sh").read_text()
        else:
            assert got["num_experts"] is None and got["ep"] == 1


def test_cli_notes_reach_stderr_and_the_launch_is_written_beside(ptd_cli, tmp_path):
    out = tmp_path / "ds.json"
    argv = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "8192", "--fix", "tp=2,pp=2,vpp=2,zero=1,"
            "schedule=interleaved-1f1b"]
    rc, _, err = ptd_cli(*argv, "--export", "deepspeed", "-o", str(out))
    assert rc == 0 and "deepspeed cannot express: schedule interleaved-1f1b" in err
    assert json.loads(out.read_text())["train_batch_size"] == 64
    assert "interleaved-1f1b" in (tmp_path / "ds.launch.sh").read_text()


def test_cli_names_what_each_framework_cannot_hold_of_a_moe_plan(ptd_cli, tmp_path):
    argv = ["plan", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "64",
            "--global-batch", "256", "--seq-len", "4096", "--fix",
            "ep=4,tp=2,pp=4,zero=0,schedule=1f1b"]
    want = {"deepspeed": "the 8 experts (top-2 routing) and expert parallelism ep 4 have no "
                         "ds_config key: deepspeed.moe.layer.MoE(",
            "torchtitan": "mixtral-8x7b has no torchtitan config function: written as qwen3 "
                          "qwen3_moe_debug; register one with",
            "megatron": "experts over tp: Megatron shards each expert over tp"}
    for fw, note in want.items():
        rc, _, err = ptd_cli(*argv, "--export", fw, "-o", str(tmp_path / fw))
        assert rc == 0 and f"ptd plan: {fw} cannot express: {note}" in err, err


@pytest.mark.timeout(300)
def test_a_spread_of_chosen_plans_is_accepted_as_planned(fed):
    """helpers.EXPORT_SPREAD (winners and runners-up covering every feature, GPT-2, MoE,
    fp16/fp32 on several hardware presets): every framework takes every export, and reads
    the plan's degrees, batches, precision and split."""
    spread = {k: v for k, v in fed.items() if k.startswith("spread-")}
    assert len(spread) == len(export_spread()) and len(spread) > 20
    tt_dtype = {"bf16": "bfloat16", "fp32": "float32", "fp16": "bfloat16"}  # fp16: named
    for name, (e, res, _) in spread.items():
        p = e.plan
        ds = _ok(res, "deepspeed", name)
        assert (ds["train_batch_size"], ds["micro_batch"], ds["dp"], ds["zero"]) == \
            (p.global_batch, p.micro_batch, p.dp, p.zero)
        assert (ds["bf16"], ds["fp16"]) == (p.dtype == "bf16", p.dtype == "fp16")
        tt = _ok(res, "torchtitan", name)
        assert (tt["tp"], tt["pp"], tt["dp_replicate"] * tt["dp_shard"], tt["ep"], tt["cp"]) == \
            (p.tp, p.pp, p.dp, p.ep, p.cp)
        assert tt["param_dtype"] == tt_dtype[p.dtype] and tt["ac"] == AC[p.recompute]
        mg = _ok(res, "megatron", name)
        assert (mg["tp"], mg["pp"], mg["dp"], mg["ep"], mg["cp"]) == (p.tp, p.pp, p.dp, p.ep, p.cp)
        assert mg["bf16"] == (p.dtype == "bf16")
        assert (mg["micro_batch"], mg["global_batch"]) == (p.micro_batch, p.global_batch)
        if p.pp > 1:
            assert mg["layout_stages"] == list(stages(e)) and tt["parts"] is not None
