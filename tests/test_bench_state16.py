"""fp16lab.bench.state16 (notebook 11's long runs): its language, its rows and its summary,
on the CPU with a tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fp16lab.bench import state16 as bench


def test_language_follows_its_successor_table():
    """Every next token is one of the BRANCHES successors its token was given, and each of them
    turns up: the loss floor ln(BRANCHES) is the language's real entropy per token."""
    data = bench.language(vocab=50, seq=20, batch=16, steps=30, seed=7)
    assert data.shape == (30, 16, 21)
    table = np.random.default_rng(7).integers(0, 50, size=(50, bench.BRANCHES))
    pairs = data[..., :-1].reshape(-1).numpy(), data[..., 1:].reshape(-1).numpy()
    follows: dict[int, set[int]] = {}
    for a, b in zip(*pairs):
        assert b in table[a]
        follows.setdefault(int(a), set()).add(int(b))
    common = max(follows, key=lambda a: len(follows[a]))
    assert follows[common] == set(table[common].tolist())


def test_quick_run_writes_rows_and_a_summary_that_add_up(tmp_path):
    pytest.importorskip("transformers")
    assert bench.main(["--quick", "--sources", "ours", "--steps", "6", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "state16_quick.json").read_text())
    rows, meta = payload["rows"], payload["meta"]
    assert [r["method"] for r in rows] == list(bench.OURS)
    assert all(len(r["losses"]) == 6 == len(r["unchanged"]) for r in rows)
    # counted from the tensors: weight + gradient + AdamW16's fp32 moments (+ Kahan's buffer)
    counted = {r["method"]: r["counted_bytes_per_parameter"] for r in rows}
    assert counted == {"fp32-master": 4 + 4 + 8, "bf16-nearest": 2 + 2 + 8,
                       "bf16-stochastic": 2 + 2 + 8, "bf16-kahan": 2 + 2 + 8 + 2}
    assert rows[0]["unchanged"][-1] < 0.01 < rows[1]["unchanged"][-1]  # FP32 keeps updates
    lines = {s["method"]: s for s in meta["summary"]}
    ref = np.mean(rows[0]["losses"][-50:])
    assert lines["fp32-master"]["vs_fp32_master"] == 0
    assert lines["bf16-nearest"]["vs_fp32_master"] == pytest.approx(
        np.mean(rows[1]["losses"][-50:]) / ref - 1)
    assert meta["loss_floor"] == pytest.approx(math.log(bench.BRANCHES))
    assert math.isnan(lines["bf16-kahan"]["final_loss_std"])  # one seed: no spread


def test_summary_spread_over_seeds_by_hand():
    rows = [{"source": "ours", "method": m, "losses": [l] * 60, "unchanged": [u] * 60,
             "counted_bytes_per_parameter": 16, "predicted_bytes_per_parameter": 16}
            for m, l, u in (("fp32-master", 2.0, 0.0), ("fp32-master", 2.2, 0.0),
                            ("bf16-nearest", 2.5, 0.4), ("bf16-nearest", 2.3, 0.2))]
    lines = {s["method"]: s for s in bench.summary(rows)}
    assert lines["fp32-master"]["final_loss"] == pytest.approx(2.1)
    assert lines["fp32-master"]["final_loss_std"] == pytest.approx(np.std([2.0, 2.2], ddof=1))
    assert lines["bf16-nearest"]["vs_fp32_master"] == pytest.approx(2.4 / 2.1 - 1)
    assert lines["bf16-nearest"]["unchanged_last"] == pytest.approx(0.3)
    assert lines["bf16-nearest"]["seeds"] == 2 and lines["bf16-nearest"]["peak_bytes"] is None


def test_bad_flags_are_refused_before_any_work(capsys):
    for argv in (["--steps", "1"], ["--seeds", "0"], ["--lr", "nan"], ["--sources", "theirs"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv + ["--quick"])
        assert e.value.code == 2


def test_seeds_run_in_parallel_give_the_rows_of_a_sequential_run(tmp_path):
    """--jobs trains each seed in its own process: the merged rows are the ones one process
    computes seed after seed (same batches, same initial weights per seed), in seed order."""
    pytest.importorskip("transformers")
    common = ["--quick", "--sources", "ours", "--steps", "3", "--seeds", "2"]
    assert bench.main([*common, "--out", str(tmp_path / "one")]) == 0
    assert bench.main([*common, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    one = json.loads((tmp_path / "one" / "state16_quick.json").read_text())
    two = json.loads((tmp_path / "two" / "state16_quick.json").read_text())
    key = [(r["seed"], r["method"]) for r in one["rows"]]
    assert key == [(r["seed"], r["method"]) for r in two["rows"]]
    assert [s for s, _ in key] == [0] * 4 + [1] * 4
    for a, b in zip(one["rows"], two["rows"]):
        assert a["losses"] == b["losses"] and a["unchanged"] == b["unchanged"]
    assert two["meta"]["jobs"] == 2 and one["meta"]["jobs"] == 1


def test_children_get_the_parents_options_less_its_output():
    argv = ["--steps", "5", "--out", "/x", "--jobs=3", "--replace", "--name", "n", "--lr", "0.1"]
    assert bench._without_output(argv) == ["--steps", "5", "--lr", "0.1"]


def test_merge_adds_seeds_from_a_second_invocation_and_refuses_other_settings(tmp_path, capsys):
    """--first-seed 1 --merge trains seed 1 and keeps the file's seed 0: the rows are those of
    one invocation training seeds 0 and 1, and the summary spans both. A run of another length
    is refused before it trains, and the file is left as it was."""
    pytest.importorskip("transformers")
    common = ["--quick", "--sources", "ours", "--steps", "3"]
    assert bench.main([*common, "--seeds", "2", "--out", str(tmp_path / "both")]) == 0
    split = str(tmp_path / "split")
    assert bench.main([*common, "--seeds", "1", "--out", split]) == 0
    assert bench.main([*common, "--seeds", "1", "--first-seed", "1", "--merge",
                       "--out", split]) == 0
    both = json.loads((tmp_path / "both" / "state16_quick.json").read_text())
    path = tmp_path / "split" / "state16_quick.json"
    merged = json.loads(path.read_text())
    pick = lambda p: {(r["seed"], r["method"]): r["losses"] for r in p["rows"]}  # noqa: E731
    assert pick(merged) == pick(both)
    assert merged["meta"]["seeds"] == 2
    assert [s["seeds"] for s in merged["meta"]["summary"]] == [2] * len(bench.OURS)
    # the same seed again replaces its rows rather than adding a copy
    assert bench.main([*common, "--seeds", "1", "--first-seed", "1", "--merge",
                       "--out", split]) == 0
    assert len(json.loads(path.read_text())["rows"]) == 2 * len(bench.OURS)
    before = path.read_text()
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--sources", "ours", "--steps", "4", "--merge", "--out", split])
    assert e.value.code == 2 and "steps 3" in capsys.readouterr().err
    assert path.read_text() == before


def test_methods_picks_the_ways_trained(tmp_path):
    pytest.importorskip("transformers")
    assert bench.main(["--quick", "--sources", "ours", "--methods", "bf16-kahan,fp32-master",
                       "--steps", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "state16_quick.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["fp32-master", "bf16-kahan"]  # the benchmark's order


def test_a_child_of_jobs_never_starts_children(monkeypatch, tmp_path):
    """Each seed's child process is told --jobs 1 last, whatever the parent's argv held: a child
    that parsed --jobs 3 would start three more, and so on."""
    started = []

    class Stop(Exception):
        pass

    def popen(cmd):
        started.append(cmd)
        raise Stop

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        bench._seeds_in_parallel(["--quick", "--jobs", "3", "--jobs=3"], [0, 1], 2)
    cmd = started[0]
    assert cmd[-2:] == ["--jobs", "1"] and cmd[cmd.index("--seed-only") + 1] == "0"
