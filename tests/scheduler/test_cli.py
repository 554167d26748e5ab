"""``gpuwarden fairshare`` and ``gpuwarden scheduler --snapshot``, in process."""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser, main


def example(name: str) -> str:
    return str(resources.files("scheduler") / "examples" / name)


def test_fairshare_prints_the_share_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fairshare", example("fairshare.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Node pool default (healthy capacity: 32 GPUs, 512 cores, 4096 GiB)" in out
    header = next(line for line in out.splitlines() if line.startswith("QUEUE"))
    assert header.split() == ["QUEUE", "RESOURCE", "QUOTA", "LIMIT", "WEIGHT", "REQUEST", "FAIR", "SHARE"]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "gpu (GPUs)" in line}
    # queue, resource (2 words), quota, limit, weight, request, fair share
    assert rows["research"][-1] == "26"
    assert rows["vision"][-1] == "11"
    assert rows["nlp"][-1] == "15"
    assert rows["production"][-1] == "6" and rows["production"][4] == "12"
    assert "  vision" in out  # children are indented under their parent


def test_scheduler_runs_one_session_on_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "json", "scheduler", "--snapshot", example("snapshot.yaml")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Binds (8)"
    # nlp reclaims node-b from vision's sweeps for its 2 x 4-GPU gang, which binds once they are gone;
    # vision's short gang is completed on node-e, within vision's fair share, rather than evicted.
    train = [line.split() for line in lines if line.startswith("default/nlp-train ")]
    assert {tuple(b[2:4]) for b in train} == {("node-b", "0,1,2,3"), ("node-b", "4,5,6,7")}
    assert all(b[-1] == "yes" for b in train)
    bind = next(line.split() for line in lines if line.startswith("default/nlp-big "))
    assert bind[2:4] == ["node-e", "2,3,4,5"] and bind[-1] == "no"
    chat = next(line.split() for line in lines if line.startswith("default/chat-a "))
    assert chat[2:5] == ["inf-1", "0", "40960"]
    evictions = {line.split()[1]: line.split() for line in lines if line.startswith("default/") and "node-" in line}
    assert evictions["nlp-eval-0"][3:5] == ["HealthEviction", "-"]
    assert evictions["vision-sweep-1-0"][3:5] == ["Reclaim", "default/nlp-train"]
    assert evictions["vision-sweep-2-0"][3:5] == ["Reclaim", "default/nlp-train"]
    assert "default/nlp-huge (queue nlp): OverLimit: queue nlp has a gpu limit of 16 GPUs" in out
    assert "default/orphan (queue ghost): UnknownQueue" in out
    assert "default/bad-slice (queue serving): InvalidRequest" in out


def test_scheduler_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["--log-format", "json", "scheduler", "--snapshot", example("snapshot.yaml"), "--decisions-format", "json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert len(data["binds"]) == 8
    assert {e["action"] for e in data["evictions"]} == {"HealthEviction", "Reclaim"}


def test_snapshot_flag_has_env_equivalent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUWARDEN_SNAPSHOT", example("snapshot.yaml"))
    assert main(["--log-format", "json", "scheduler"]) == 0
    assert capsys.readouterr().out.startswith("Binds (8)")


def test_bad_files_get_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "nodes:\n  - {name: n1, cpu: lots, memory: 1Qi}\njobs:\n  - {name: j, tasks: [{name: t, status: Done}]}\n"
    )
    assert main(["--log-format", "json", "scheduler", "--snapshot", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "4 problem(s)" in err
    assert "nodes[0].cpu: not a CPU amount: 'lots'" in err
    assert "nodes[0].memory: not a memory quantity: '1Qi'" in err
    assert "jobs[0].queue: required" in err
    assert "jobs[0].tasks[0].status: unknown status 'Done'" in err

    missing = tmp_path / "missing.yaml"
    assert main(["fairshare", str(missing)]) == 2
    assert "cannot read" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    broken.write_text("queues: [\n")
    assert main(["fairshare", str(broken)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_fairshare_warns_about_bad_queues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fs.yaml"
    f.write_text(
        "capacity: {default: {gpu: 4}}\n"
        "queues:\n  - {name: a, gpu: {quota: 1}}\n  - {name: lost, parent: nobody}\n"
        "demand: {a: {gpu: 8}, ghost: {gpu: 1}}\n"
    )
    assert main(["fairshare", str(f)]) == 0
    out = capsys.readouterr().out
    assert "warning: queue lost left out: queue lost: parent queue nobody does not exist" in out
    assert "warning: demand for unknown queue ghost ignored" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("a "))
    assert row[-1] == "4"


@pytest.mark.parametrize(
    ("command", "what"), [(["fairshare"], "fair-share file"), (["scheduler", "--snapshot"], "snapshot")]
)
def test_a_file_that_is_not_utf8_gets_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], what: str
) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("queues: [{name: \xe9quipe}]\n".encode("latin-1"))
    assert main(["--log-format", "json", *command, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{what} {path} is not UTF-8 text: byte 0xe9 at offset 16" in err
    assert "Traceback" not in err


def test_nan_and_misspelt_keys_get_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fs.yaml"
    f.write_text("capacity: {default: {gpu: .nan}}\nqueues:\n  - {name: a, gpu: {quota: 1, limt: 2}}\n")
    assert main(["fairshare", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"gpuwarden fairshare: {f}: 2 problem(s):" in err
    assert "capacity.default.gpu: must be a finite number, got nan" in err
    assert "queues[0].gpu.limt: unknown key 'limt' (did you mean 'limit'?)" in err


def test_a_queue_defined_twice_is_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fs.yaml"
    f.write_text(
        "capacity: {default: {gpu: 4}}\n"
        "queues:\n  - {name: a}\n  - {name: b}\n  - {name: a, gpu: {quota: 1}}\n"
        "demand: {a: {gpu: 8}}\n"
    )
    assert main(["fairshare", str(f)]) == 2
    captured = capsys.readouterr()
    assert "queues[2].name: queue 'a' is defined twice (queues[0] and queues[2])" in captured.err
    assert "unknown queue" not in captured.err + captured.out


def test_a_kubeconfig_that_cannot_be_used_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scheduler", "--kubeconfig", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "cannot use the kubeconfig" in err and "Traceback" not in err


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def test_every_flag_whose_help_gives_a_meaning_to_zero_accepts_zero() -> None:
    """``(0: unpaced)`` in a flag's help is a promise its parser must keep."""
    parser = _subcommand("scheduler")
    promised = [a for a in parser._actions if a.option_strings and a.help and "(0:" in a.help]
    assert {a.option_strings[0] for a in promised} >= {"--bookkeeping-defer", "--bookkeeping-qps"}
    for action in promised:
        assert action.type is not None
        assert action.type("0") == 0, action.option_strings
