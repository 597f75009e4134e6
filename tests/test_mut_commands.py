"""The command layer by hand, from sampled mutation runs of commands/estimate.py (30 of 604:
15 killed) and commands/train.py with args.py (30 of 384: 18 killed), seed 20261129
(docs/testing.md): what `ptd estimate` prints beside its JSON, the zero-bubble V's stage
count, the default GPUs per node, the integer flags' bounds, `ptd train`'s --nproc message
and the Slurm script's GPU line."""

import argparse
import json
import re

import pytest

from ptd.commands.args import positive_int, positive_ints

EST = ["estimate", "--model", "llama2-13b", "--hardware", "a100-80g", "--seq-len", "1024",
       "--global-batch", "64"]


def test_zero_bubble_v_counts_two_stages_a_rank(ptd_cli):
    # 40 layers on pp 8: 5 a rank divide, but the V's 16 stages do not (40 / 16)
    rc, out, err = ptd_cli(*EST, "--gpus", "8", "--pp", "8", "--vpp", "1",
                           "--schedule", "zero-bubble")
    assert rc == 0, err
    assert "uneven_stages=True (40 layers do not divide over 16 stages)" in out



def test_a_free_vpp_that_divides_the_layers_is_not_labelled_uneven(ptd_cli):
    # vpp free on the zero-bubble schedule: the V's default (2 chunks a rank, 16 stages)
    # does not divide 40 layers, but vpp 5 (40 stages, one layer each) does. Whatever the
    # search picks, the label and its reason must be those of the picked plan's own stages.
    rc, out, err = ptd_cli(*EST, "--gpus", "8", "--pp", "8", "--schedule", "zero-bubble", "--json")
    assert rc == 0, err
    plan = json.loads(out)["plan"]
    stages = 8 * (plan["vpp"] if plan["vpp"] > 2 else 2)
    assert plan["uneven_stages"] == (40 % stages != 0)
    rc, text, _ = ptd_cli(*EST, "--gpus", "8", "--pp", "8", "--schedule", "zero-bubble")
    if plan["uneven_stages"]:
        assert f"uneven_stages=True (40 layers do not divide over {stages} stages)" in text
    else:
        assert "uneven" not in text
    # the search itself: each candidate is uneven exactly when 40 layers do not divide over
    # its own stages (1f1b: 8; the V at vpp 1: 16; interleaved/zero-bubble at vpp 5: 40)
    from ptd.cost.estimate import candidates
    from ptd.specs import ParallelPlan, get_preset
    base = ParallelPlan(pp=8, global_batch=64, seq_len=1024, uneven_stages=True)
    seen = {(p.schedule, p.vpp, p.uneven_stages)
            for p in candidates(get_preset("llama2-13b"), base, ["vpp", "schedule"], auto_uneven=True)}
    assert seen == {("1f1b", 1, False), ("gpipe", 1, False), ("zero-bubble", 1, True),
                    ("interleaved-1f1b", 5, False), ("zero-bubble", 5, False)}
    # and a vpp of 5 asked for outright is even: 40 layers over 8 x 5 stages
    rc, out, err = ptd_cli(*EST, "--gpus", "8", "--pp", "8", "--schedule", "zero-bubble",
                           "--vpp", "5", "--json")
    assert rc == 0, err
    assert json.loads(out)["plan"]["uneven_stages"] is False

def test_estimate_text_figures_are_the_json_figures(ptd_cli):
    flags = [*EST, "--gpus", "16", "--dp", "8", "--cp", "2", "--micro-batch", "2"]
    rc, out, err = ptd_cli(*flags, "--json")
    assert rc == 0, err
    d = json.loads(out)
    rc, text, _ = ptd_cli(*flags)
    # model TFLOP/s per device = MFU x the A100's 312 TFLOP/s
    tf = float(re.search(r"model TFLOP/s per device\s+([\d.]+)", text).group(1))
    assert tf == pytest.approx(d["mfu"] * 312, abs=0.05)
    # the memory shares are each part over the total
    shares = {m.group(1): float(m.group(2)) for m in
              re.finditer(r"^(params|grads|optimizer|activations)\s+[\d.]+ [KMGT]iB\s+([\d.]+)%$", text,
                              re.M)}
    mem = d["memory_per_device_bytes"]
    assert len(shares) == 4
    for k, share in shares.items():
        assert share == pytest.approx(100 * mem[k] / mem["total"], abs=0.05), k
    # cp on: its exchange's share of the step is printed with the total exchange
    cp = re.search(r"cp_comm\s+\S+ \S+\s+([\d.]+)%", text)
    assert cp and float(cp.group(1)) == pytest.approx(
        100 * d["step_time_s"]["cp_comm"] / d["step_time_s"]["total"], abs=0.05)
    assert "ep_comm" not in text  # no experts
    assert "(4 micro-batches/step)" in text  # 64 / (2 x 8)


def test_estimate_defaults_to_the_hardware_gpus_per_node(ptd_cli):
    def step(*extra):
        rc, out, err = ptd_cli(*EST, "--gpus", "16", "--dp", "16", *extra, "--json")
        assert rc == 0, err
        return json.loads(out)["step_time_s"]["total"]
    assert step() == step("--gpus-per-node", "8") != step("--gpus-per-node", "1")


def test_one_micro_batch_is_singular(ptd_cli):
    rc, out, _ = ptd_cli(*EST, "--gpus", "8", "--dp", "8", "--global-batch", "8",
                         "--micro-batch", "1")
    assert "(1 micro-batch/step)" in out


def test_integer_flags_bounds():
    assert positive_ints("4,1,2,2") == [1, 2, 4]
    for bad in ("0,1", "1,0", "", "a"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_ints(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="1..4"):
        positive_ints("2,5", limit=4)
    assert positive_int("1") == 1
    for bad in ("0", "-1", "1.5", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)


def test_nproc_not_a_multiple_of_a_replica_names_cp(ptd_cli, tmp_path):
    rc, _, err = ptd_cli("train", "--model", "tiny", "--nproc", "6", "--tp", "2", "--cp", "2",
                         "--dry-run", "--out", str(tmp_path / "r"))
    assert rc == 2 and "--nproc 6 is not divisible by tp*pp*cp = 4" in err
    rc, _, err = ptd_cli("train", "--model", "tiny", "--nproc", "3", "--tp", "2",
                         "--dry-run", "--out", str(tmp_path / "r"))
    assert rc == 2 and "--nproc 3 is not divisible by tp*pp = 2" in err


@pytest.mark.parametrize("hw, gpus", [("a100-80g", True), ("h100-sxm", True), ("cpu", False)])
def test_slurm_script_asks_for_gpus_on_gpu_hardware(ptd_cli, tmp_path, hw, gpus):
    script = tmp_path / "job.sh"
    rc, _, err = ptd_cli("train", "--model", "tiny", "--nproc", "4", "--hardware", hw,
                         "--nnodes", "2", "--slurm-script", str(script),
                         "--out", str(tmp_path / "r"))
    assert rc == 0, err
    assert ("#SBATCH --gpus-per-node=2" in script.read_text()) == gpus


def test_integer_flags_stop_at_two_to_the_fortieth():
    assert positive_int(str(2**40)) == 2**40
    with pytest.raises(argparse.ArgumentTypeError, match="at most 2\\*\\*40"):
        positive_int(str(2**40 + 1))


def test_expert_parallel_prints_its_exchange(ptd_cli):
    rc, out, err = ptd_cli("estimate", "--model", "tiny-moe", "--hardware", "cpu", "--gpus", "2",
                           "--dp", "2", "--ep", "2", "--global-batch", "8", "--seq-len", "64",
                           "--dtype", "fp32")
    assert rc == 0, err
    assert re.search(r"^ep_comm\s", out, re.M)


@pytest.mark.parametrize("servers, said", [("1", "through 1 synchronous parameter server:"),
                                           ("3", "through 3 synchronous parameter servers:")])
def test_parameter_server_note_counts_its_servers(ptd_cli, servers, said):
    rc, out, err = ptd_cli(*EST, "--gpus", "2", "--dp-comm", "ps", "--servers", servers)
    assert rc == 0, err
    assert said in out
