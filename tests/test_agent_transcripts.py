"""Agent transcripts as traces (docs/AGENT_TRACES.md): Claude Code JSONL sessions and
OpenAI-compatible chat completion logs, the provider-cache comparison, Weka files at any block
size and absolute session starts, and arrivals counted from the first request
(rebase_to_first_arrival) with throughput over the span that holds requests."""
from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import SINGLE_ENGINE
from traces import TraceError, load_workload

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 1, 5, 9, 0, 0, tzinfo=dt.timezone.utc)
G = 16


def ts(s: float) -> str:
    return (T0 + dt.timedelta(seconds=s)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Transcript:
    """Writes Claude Code transcript lines (the fields the loader reads, as Claude Code writes
    them, plus some it passes over)."""

    def __init__(self, session: str, side: bool = False, agent: str | None = None):
        self.session, self.side, self.agent = session, side, agent
        self.lines: list[dict] = []
        self.n = 0

    def _line(self, typ: str, parent, t: float, **kw) -> str:
        self.n += 1
        u = f"{self.session}-{'a' + self.agent if self.agent else 'm'}-{self.n}"
        o = {"parentUuid": parent, "isSidechain": self.side, "userType": "external",
             "cwd": "/w", "sessionId": self.session, "version": "2.1.0", "type": typ,
             "uuid": u, "timestamp": ts(t)}
        if self.agent:
            o["agentId"] = self.agent
        o.update(kw)
        self.lines.append(o)
        return u

    def user(self, parent, t: float, **kw) -> str:
        return self._line("user", parent, t, message={"role": "user", "content": "x"}, **kw)

    def call(self, parent, t: float, mid: str, inp: int, cw: int, cr: int, out: int,
             blocks: int = 2, model: str = "claude-sonnet-4-5") -> str:
        """One API response written as ``blocks`` lines 1 s apart (output growing to ``out``)."""
        u = parent
        for b in range(blocks):
            usage = {"input_tokens": inp, "cache_creation_input_tokens": cw,
                     "cache_read_input_tokens": cr, "output_tokens": out if b == blocks - 1 else 1,
                     "service_tier": "standard"}
            u = self._line("assistant", u, t + b, requestId=f"req-{mid}",
                           message={"id": mid, "type": "message", "role": "assistant",
                                    "model": model, "content": [{"type": "text", "text": "y"}],
                                    "usage": usage})
        return u

    def text(self) -> str:
        return "".join(json.dumps(o) + "\n" for o in self.lines)


def project(tmp_path: Path) -> Path:
    """Two sessions, a linked sub-agent (new layout), an unlinked warm-up sidechain, a synthetic
    error entry, a shorter prompt and a compaction. Calls are named by their prompt length."""
    d = tmp_path / "proj"
    (d / "sess-1" / "subagents").mkdir(parents=True)
    a = Transcript("sess-1")
    u0 = a.user(None, 0.0)
    c1 = a.call(u0, 2.0, "m1", 10, 1990, 0, 40)  # prompt 2000, end 3
    u1 = a.user(c1, 10.0)
    c2 = a.call(u1, 12.0, "m2", 5, 100, 1995, 30)  # prompt 2100 >= 2000 + 40: continues m1
    syn = a._line("assistant", c2, 20.0, message={
        "id": "msg-syn", "model": "<synthetic>", "role": "assistant", "content": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}, isApiErrorMessage=True)
    a.lines.insert(0, {"type": "summary", "summary": "t", "leafUuid": "x"})  # (no uuid: passed over)
    u2 = a.user(syn, 30.0)
    a.call(u2, 31.0, "m3", 5, 0, 1500, 20)  # prompt 1505 < 2100: not extending
    a.user(c2, 40.0, toolUseResult={"status": "completed", "agentId": "a1"},
           sourceToolAssistantUUID=c2)  # the Task result: links sub-agent a1 to m2
    (d / "sess-1.jsonl").write_text(a.text())
    sub = Transcript("sess-1", side=True, agent="a1")
    s0 = sub.user(None, 13.5)
    s1 = sub.call(s0, 14.0, "m4", 3, 800, 0, 10)  # prompt 803: a chain of its own
    s2 = sub.user(s1, 16.0)
    sub.call(s2, 17.0, "m5", 3, 20, 800, 5)  # prompt 823 >= 813
    (d / "sess-1" / "subagents" / "agent-a1.jsonl").write_text(sub.text())
    w = Transcript("sess-1", side=True, agent="w")
    w.call(w.user(None, 100.0), 100.5, "m8", 1000, 0, 0, 1, blocks=1)  # Warmup: not linked
    (d / "agent-w.jsonl").write_text(w.text())
    b = Transcript("sess-2")
    c6 = b.call(b.user(None, 50.0), 51.0, "m6", 4, 500, 1400, 7)  # root reading 1400 cached
    cut = b._line("system", None, 60.0, subtype="compact_boundary", logicalParentUuid=c6)
    b.call(b.user(cut, 61.0), 62.0, "m7", 3, 300, 1400, 9)  # after the compaction
    (d / "sess-2.jsonl").write_text(b.text())
    (d / "empty.jsonl").write_text("")
    (d / "sessions-index.json").write_text("{}")  # (not a transcript: not read)
    return d


def cc(path, **kw):
    return load_workload({"name": "t", "format": "claude_code", "path": str(path),
                          "cache": False, **kw}, 0)


def by_prompt(w) -> dict:
    return {int(p): i for i, p in enumerate(w.input_tokens)}


def ids(w, i) -> list:
    return w.prefix_ids_of(i).tolist()


# ---------------------------------------------------------------- Claude Code
def test_claude_code_calls_chains_and_times(tmp_path):
    w = cc(project(tmp_path))
    r = by_prompt(w)
    assert sorted(r) == [803, 823, 1000, 1505, 1703, 1904, 2000, 2100]
    assert w.prefix_block_tokens == G and w.num_sessions == 2
    n = w.notes
    assert (n["calls"], n["synthetic_entries"], n["subagent_chains_linked"],
            n["sidechain_chains_unlinked"], n["compactions"], n["prompts_not_extending"],
            n["files"], n["files_empty"]) == (8, 1, 1, 1, 1, 2, 4, 1)
    par, turn, think, arr = w.parent_request_id, w.turn, w.think_s, w.arrival_s
    # m1 (root at 0) -> m2 (think 10 - 3) -> m3 (through the synthetic entry: 30 - 13)
    assert par[r[2000]] == -1 and arr[r[2000]] == 0.0 and turn[r[2000]] == 0
    assert par[r[2100]] == r[2000] and think[r[2100]] == pytest.approx(7.0) and turn[r[2100]] == 1
    assert par[r[1505]] == r[2100] and think[r[1505]] == pytest.approx(17.0)
    # the sub-agent: released by m2's finish (13) + 0.5 s, a chain of its own, same session
    assert par[r[803]] == r[2100] and turn[r[803]] == 0 and think[r[803]] == pytest.approx(0.5)
    assert par[r[823]] == r[803] and turn[r[823]] == 1
    assert w.session_id[r[803]] == w.session_id[r[2000]] != w.session_id[r[1904]]
    # the warm-up sidechain and the second session are roots at their recorded times
    assert par[r[1000]] == -1 and arr[r[1000]] == pytest.approx(100.0)
    assert par[r[1904]] == -1 and arr[r[1904]] == pytest.approx(50.0)
    assert par[r[1703]] == r[1904] and think[r[1703]] == pytest.approx(61.0 - 52.0)
    # one response of two lines: its output is the last line's, counted once
    assert w.output_tokens[r[2000]] == 40 and w.output_tokens[r[1000]] == 1
    assert w.notes["time_origin_unix_s"] == pytest.approx(T0.timestamp())
    # parents before children, roots in arrival order
    assert all(p < i for i, p in enumerate(par) if p >= 0)
    assert np.all(np.diff(arr[par < 0]) >= 0)
    # the provider's numbers, per call
    cached, written = w.extra["provider_cached_tokens"], w.extra["provider_cache_write_tokens"]
    assert (cached[r[2100]], written[r[2100]], cached[r[1904]]) == (1995, 100, 1400)


def test_claude_code_prefix_ids_continue_the_parents_prompt_and_answer(tmp_path):
    w = cc(project(tmp_path))
    r = by_prompt(w)
    m1, m2, m3 = ids(w, r[2000]), ids(w, r[2100]), ids(w, r[1505])
    assert len(m1) == 2000 // G and len(m2) == 2100 // G and len(m3) == 1505 // G
    # m2 starts with m1's prompt and answer: 2040 tokens = 127 ids, 125 of them m1's own
    assert m2[:125] == m1 and not set(m2[125:]) & set(m1)
    # m3 is shorter than m2: it shares what the provider read, 1500 tokens = 93 ids
    assert m3[:93] == m2[:93] and m3[93:] and m3[93] not in m2
    # the sub-agent starts fresh; its second call continues it
    m4, m5 = ids(w, r[803]), ids(w, r[823])
    assert not set(m4) & (set(m1) | set(m2)) and m5[:len(m4)] == m4
    # the compaction: m7 shares the 1400 tokens the provider read (87 ids) of m6
    m6, m7 = ids(w, r[1904]), ids(w, r[1703])
    assert m7[:87] == m6[:87] and m7[87] not in m6
    # the simulator's contract: no id twice in a request
    from sim.keys import first_repeated_id
    assert first_repeated_id(w.prefix_offsets(), w.prefix_values()) == (-1, 0)


def test_claude_code_share_system_prefix_and_block_tokens(tmp_path):
    d = project(tmp_path)
    w = cc(d, share_system_prefix=True)
    r = by_prompt(w)
    # chain starts take their provider-cached leading tokens from one shared pool: only m6
    # (1400 cached) has any; m1 and the sub-agent read none
    assert w.notes["shared_prefix_ids"] == 1400 // G
    pool = ids(w, r[1904])[:1400 // G]
    assert ids(w, r[1703])[:1400 // G] == pool and not set(pool) & set(ids(w, r[2000]))
    assert any("share_system_prefix" in m for m in w.warnings)
    w64 = cc(d, block_tokens=64)
    assert w64.prefix_block_tokens == 64 and len(w64.prefix_ids_of(by_prompt(w64)[2100])) == 32
    with pytest.raises(TraceError, match="field 'block_tokens'"):
        cc(d, block_tokens=0)


def test_claude_code_folder_and_one_file_give_the_same_table(tmp_path):
    d = project(tmp_path)
    one = tmp_path / "all.jsonl"
    files = sorted((q for q in d.rglob("*.jsonl") if q.stat().st_size),
                   key=lambda q: q.relative_to(d).as_posix())
    one.write_text("".join(q.read_text() for q in files))
    assert cc(d).table.equals(cc(one).table)
    # a resumed session repeats lines already read: each uuid counts once
    dup = tmp_path / "dup"
    shutil.copytree(d, dup)
    (dup / "zz-copy.jsonl").write_text((d / "sess-2.jsonl").read_text())
    w = cc(dup)
    assert w.table.equals(cc(d).table) and w.notes["lines_copied"] == 7  # (all of sess-2's)


def test_claude_code_session_arrivals_and_max_sessions(tmp_path):
    d = project(tmp_path)
    rec = cc(d, session_arrival="recorded", session_interval_s=1000.0)
    r = by_prompt(rec)
    # sessions in order of their first call; each keeps its calls' offsets
    assert rec.arrival_s[r[2000]] == 0.0 and rec.arrival_s[r[1000]] == pytest.approx(100.0)
    assert rec.arrival_s[r[1904]] == pytest.approx(1000.0)
    p1 = cc(d, session_arrival="poisson", session_rate_per_s=0.01)
    p2 = load_workload({"name": "t", "format": "claude_code", "path": str(d), "cache": False,
                        "session_arrival": "poisson", "session_rate_per_s": 0.01}, 1)
    assert p1.arrival_s[by_prompt(p1)[2000]] == 0.0
    assert p1.arrival_s[by_prompt(p1)[1904]] != p2.arrival_s[by_prompt(p2)[1904]]
    one = cc(d, max_sessions=1)
    assert one.num_sessions == 1 and sorted(by_prompt(one)) == [803, 823, 1000, 1505, 2000, 2100]
    # slicing on the trace clock keeps whole chains
    late = cc(d, start_s=40.0)
    assert sorted(by_prompt(late)) == [1000, 1703, 1904] and late.arrival_s.min() == 0.0


def _write(tmp_path, lines, name="x.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


@pytest.mark.parametrize("change, message", [
    (lambda L: L[2]["message"]["usage"].update(cache_read_input_tokens=5),
     r"x.jsonl line 3, field 'message.usage': usage differs between the lines of one API "
     r"response, found input/cache_creation/cache_read tokens \(10, 1990, 5\); x.jsonl line 2"),
    (lambda L: L[1].update(timestamp="yesterday at noon"), r"x.jsonl line 2, field 'timestamp'"),
    (lambda L: L[1].update(parentUuid=7), r"x.jsonl line 2, field 'parentUuid': found 7"),
    (lambda L: L[1]["message"].pop("id"), r"x.jsonl line 2, field 'message.id': missing field"),
    (lambda L: L[1]["message"]["usage"].update(output_tokens=-1),
     r"x.jsonl line 2, field 'message.usage.output_tokens': found -1, expected an integer >= 0"),
    (lambda L: L[1]["message"]["usage"].update(input_tokens="10"),
     r"field 'message.usage.input_tokens': found '10'"),
    (lambda L: L[1].pop("sessionId"), r"x.jsonl line 2, field 'sessionId': missing field"),
    (lambda L: L[1].update(isSidechain="no"), r"x.jsonl line 2, field 'isSidechain'"),
    (lambda L: L.insert(1, [1, 2]), r"x.jsonl line 2: found list, expected a JSON object"),
    (lambda L: L.insert(1, "{not json"), r"x.jsonl line 2: invalid JSON"),
])
def test_claude_code_errors_name_the_file_line_and_field(tmp_path, change, message):
    t = Transcript("s")
    t.call(t.user(None, 0.0), 1.0, "m1", 10, 1990, 0, 40)
    lines = t.lines
    change(lines)
    with pytest.raises(TraceError, match=message):
        cc(_write(tmp_path, lines))


def test_claude_code_loops_empty_folders_skip_and_no_calls(tmp_path):
    t = Transcript("s")
    t.user("loop-b", 0.0)
    t.lines[-1]["uuid"] = "loop-a"
    t.user("loop-a", 0.5)
    t.lines[-1]["uuid"] = "loop-b"
    t.call("loop-b", 1.0, "m1", 10, 1990, 0, 40)
    with pytest.raises(TraceError, match="parentUuid links that loop"):
        cc(_write(tmp_path, t.lines))
    (tmp_path / "none").mkdir()
    with pytest.raises(TraceError, match="no transcript files in the folder"):
        cc(tmp_path / "none")
    u = Transcript("s")
    u.user(None, 0.0)
    with pytest.raises(TraceError, match="no API calls found"):
        cc(_write(tmp_path, u.lines, "y.jsonl"))
    # on_error=skip: the bad line is counted and left out
    v = Transcript("s")
    v.call(v.user(None, 0.0), 1.0, "m1", 10, 1990, 0, 40)
    v.lines[0]["timestamp"] = "never"
    w = cc(_write(tmp_path, v.lines, "z.jsonl"), on_error="skip")
    assert len(w) == 1 and w.skipped["count"] == 1 and "field 'timestamp'" in w.skipped["examples"][0]


def test_claude_code_folder_is_cached_by_its_files(tmp_path):
    d = project(tmp_path)
    opts = {"name": "t", "format": "claude_code", "path": str(d),
            "cache_dir": str(tmp_path / "cache")}
    a, b = load_workload(opts, 0), load_workload(opts, 3)
    assert (a.notes["trace_cache"], b.notes["trace_cache"]) == ("miss", "hit")
    assert a.table.equals(b.table) and np.array_equal(a.extra["provider_cached_tokens"],
                                                      b.extra["provider_cached_tokens"])
    assert [x[0] for x in a.notes["trace_input"]][:2] == ["agent-w.jsonl", "empty.jsonl"]
    f = d / "sess-2.jsonl"
    f.write_text(f.read_text().replace('"output_tokens": 9', '"output_tokens": 8'))
    c = load_workload(opts, 0)
    assert c.notes["trace_cache"] == "miss" and c.output_tokens.sum() == a.output_tokens.sum() - 1


def test_bundled_claude_code_sample():
    """The bundled sample (traces/data/NOTICE.md): 43 real sessions, 878 calls, and the
    provider's totals as recorded."""
    w = load_workload({"name": "claude_code", "format": "claude_code", "cache": False}, 0)
    n = w.notes
    assert (len(w), w.num_sessions, n["subagent_chains_linked"], n["synthetic_entries"]) == \
        (878, 43, 9, 0)
    assert (n["provider_cache_read_tokens"], n["provider_cache_write_tokens"],
            n["provider_input_tokens"]) == (36_970_931, 2_465_217, 60_832)
    assert int(w.input_tokens.sum()) == 36_970_931 + 2_465_217 + 60_832
    assert int(w.extra["provider_cached_tokens"].sum()) == 36_970_931


# ---------------------------------------------------------------- end to end, provider comparison
def _run(tmp_path, overrides, name="run"):
    from sim.run import compose_config, run_simulation

    cfg = compose_config([*SINGLE_ENGINE, "model.max_model_len=200000", "sim.progress=false",
                          *overrides])
    out = tmp_path / name
    s = run_simulation(cfg, out)
    return s, pd.read_parquet(out / "requests.parquet")


def test_claude_code_run_compares_kvsim_with_the_provider(tmp_path):
    d = project(tmp_path)
    s, req = _run(tmp_path, ["trace=claude_code", f"trace.path={d}"])
    assert s["requests_finished"] == 8
    assert {"provider_cached_tokens", "provider_cache_write_tokens"} <= set(req.columns)
    pc = s["provider_cache"]
    assert pc["provider_cached_tokens"] == int(req["provider_cached_tokens"].sum()) == \
        1995 + 1500 + 800 + 1400 + 1400
    assert pc["kvsim_hit_tokens"] == int(req["prefix_hit_tokens"].sum())
    kinds = pc["by_call_kind"]
    assert sum(k["difference_tokens"] for k in kinds.values()) == \
        pc["kvsim_hit_tokens"] - pc["provider_cached_tokens"]
    assert kinds["chain_start"]["requests"] == 4 and kinds["chain_start"]["kvsim_hit_tokens"] == 0
    by = {r["session_id"]: r for r in pc["per_session"]}
    assert len(by) == 2 and sum(r["provider_cached_tokens"] for r in by.values()) == \
        pc["provider_cached_tokens"]
    # m2 hits m1's prompt and answer in whole blocks: 2040 tokens -> 127 blocks
    r = req.set_index("input_tokens")
    assert r.loc[2100, "prefix_hit_tokens"] == 2032 and r.loc[2100, "provider_cached_tokens"] == 1995


def test_bundled_claude_code_sample_is_within_3_percent_of_the_provider(tmp_path):
    """kvsim's total prefix hits on the bundled transcripts against Anthropic's recorded cache
    reads (docs/AGENT_TRACES.md has the per-session numbers and why they differ)."""
    s, req = _run(tmp_path, ["trace=claude_code"])
    pc = s["provider_cache"]
    assert pc["requests_compared"] == 878 and pc["provider_cached_tokens"] == 36_970_931
    assert abs(pc["difference_pct"]) < 3.0
    assert pc["per_session_left_out"] == 0 and len(pc["per_session"]) == 43


def test_cli_runs_a_folder_of_transcripts(tmp_path):
    d = project(tmp_path)
    out = tmp_path / "cli"
    p = subprocess.run([sys.executable, "-m", "sim.cli", "trace=claude_code", f"trace.path={d}",
                        f"output.dir={out}", "model.max_model_len=200000", "sim.progress=false"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_finished"] == 8 and s["provider_cache"]["requests_compared"] == 8


def test_provider_cache_figure(tmp_path):
    from experiments.provider_cache import main, plot_provider_cache
    from experiments.plots import PlotError, figure_data

    d = project(tmp_path)
    _run(tmp_path, ["trace=claude_code", f"trace.path={d}"], name="fig")
    assert main([str(tmp_path / "fig"), "--out", str(tmp_path / "pc.png")]) == 0
    assert (tmp_path / "pc.png").stat().st_size > 0
    t = pd.read_csv(tmp_path / "pc.csv")
    assert t["requests"].sum() == 8 and set(t.columns) >= {"kvsim_hit_tokens",
                                                          "provider_cached_tokens"}
    req = pd.read_parquet(tmp_path / "fig" / "requests.parquet")
    assert len(figure_data(plot_provider_cache(req))) == 2
    with pytest.raises(PlotError, match="provider_cached_tokens"):
        plot_provider_cache(req.drop(columns=["provider_cached_tokens"]))


# ---------------------------------------------------------------- OpenAI-compatible logs
def oa(path, **kw):
    return load_workload({"name": "t", "format": "openai_log", "path": str(path),
                          "cache": False, **kw}, 0)


def chat(sid, created, prompt, completion, cached=None, done=None, key="session_id", **kw):
    o = {"id": f"chatcmpl-{created}", "object": "chat.completion", "created": created,
         "model": "m", "choices": [], key: sid,
         "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion,
                   "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}}
    if done is not None:
        o["completed_at"] = done
    o.update(kw)
    return o


def test_openai_log_chains_and_times(tmp_path):
    t = 1_750_000_000
    lines = [chat("a", t + 10, 1100, 30, cached=992, done=t + 12),  # (file order is not time)
             chat("a", t, 1000, 50, cached=0, done=t + 2),
             chat("a", t + 20, 900, 5, cached=800),  # shorter: shares the 800 cached
             chat(7, t + 5, 600, 5, key="conversation_id", done=t + 9),
             chat(7, t + 6, 700, 5, done=t + 7),  # made while the previous one ran: a root
             chat("b", t + 3, 500, 5), chat("b", t + 30, 520, 5)]
    w = oa(_write(tmp_path, lines))
    r = by_prompt(w)
    par, think, arr = w.parent_request_id, w.think_s, w.arrival_s
    assert w.num_sessions == 3 and len(w) == 7 and arr.min() == 0.0
    assert par[r[1000]] == -1 and par[r[1100]] == r[1000] and think[r[1100]] == pytest.approx(8.0)
    assert par[r[900]] == r[1100] and think[r[900]] == pytest.approx(8.0)
    assert par[r[700]] == -1 and arr[r[700]] == pytest.approx(6.0)
    # without completed_at the think time counts from the parent's created
    assert par[r[520]] == r[500] and think[r[520]] == pytest.approx(27.0)
    assert any("without completed_at" in m for m in w.warnings)
    assert w.notes["overlapping_calls"] == 1 and w.notes["prompts_not_extending"] == 1
    a, b, c = ids(w, r[1000]), ids(w, r[1100]), ids(w, r[900])
    assert b[:len(a)] == a and len(b) == 1100 // G and c[:800 // G] == b[:800 // G]
    assert w.extra["provider_cached_tokens"][r[1100]] == 992
    # a log that reports no cached_tokens has no provider column
    plain = oa(_write(tmp_path, [chat("a", t, 1000, 5), chat("a", t + 9, 1100, 5)], "p.jsonl"))
    assert plain.extra == {}


@pytest.mark.parametrize("line, message", [
    (dict(sesion_id="a"), r"x.jsonl line 1, field 'sesion_id': unknown field"),
    (dict(conversation_id="b"), r"field 'session_id/conversation_id': found both"),
    (dict(created=-1), r"x.jsonl line 1, field 'created': found -1"),
    (dict(created="2025-01-01"), r"field 'created': found '2025-01-01'"),
    (dict(completed_at=5), r"field 'completed_at': found 5, expected >= created"),
    (dict(object="text_completion"), r"field 'object'"),
    (dict(choices={}), r"field 'choices'"),
    (dict(usage={"prompt_tokens": 0, "completion_tokens": 1}), r"field 'usage.prompt_tokens': found 0"),
    (dict(usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 12}),
     r"field 'usage.total_tokens': found 12, expected prompt_tokens \+ completion_tokens = 11"),
    (dict(usage={"prompt_tokens": 10, "completion_tokens": 1,
                 "prompt_tokens_details": {"cached_tokens": 11}}),
     r"field 'usage.prompt_tokens_details.cached_tokens': found 11, expected <= prompt_tokens"),
    (dict(usage={"prompt_tokens": 10, "completion_tokens": 1, "cached": 3}),
     r"field 'usage.cached': unknown field"),
    (dict(usage={"prompt_tokens": 10}), r"field 'usage.completion_tokens': missing field"),
])
def test_openai_log_errors_name_the_file_line_and_field(tmp_path, line, message):
    o = chat("a", 1_750_000_000, 100, 5)
    o.update(line)
    with pytest.raises(TraceError, match=message):
        oa(_write(tmp_path, [o]))


def test_openai_log_missing_fields_and_skip(tmp_path):
    o = chat("a", 1_750_000_000, 100, 5)
    del o["session_id"]
    with pytest.raises(TraceError, match=r"line 1, field 'session_id': missing field"):
        oa(_write(tmp_path, [o]))
    good = chat("a", 1_750_000_000, 100, 5)
    w = oa(_write(tmp_path, [good, o], "s.jsonl"), on_error="skip")
    assert len(w) == 1 and w.skipped["count"] == 1


DEEPSEEK_SAMPLE = REPO / "traces" / "data" / "deepseek_mini_swe_agent_sample.jsonl.xz"


def test_bundled_deepseek_openai_log_sample():
    """The bundled OpenAI-style log (traces/data/NOTICE.md): 23 real mini-SWE-agent sessions
    against the DeepSeek API, 1,843 calls, one chain each, and the provider's totals as
    recorded."""
    w = oa(DEEPSEEK_SAMPLE)
    n = w.notes
    assert (len(w), w.num_sessions, n["chains"], n["cached_tokens_reported"]) == (1843, 23, 23, 1843)
    assert (n["overlapping_calls"], n["prompts_not_extending"]) == (0, 0) and not w.warnings
    assert int(w.input_tokens.sum()) == 39_000_961 and int(w.output_tokens.sum()) == 376_068
    assert int(w.extra["provider_cached_tokens"].sum()) == 37_700_352


def test_bundled_deepseek_sample_is_within_3_percent_of_the_provider(tmp_path):
    """kvsim's total prefix hits on the bundled DeepSeek log against the provider's recorded
    cached_tokens (docs/AGENT_TRACES.md has the per-session numbers and why they differ)."""
    s, req = _run(tmp_path, ["trace=openai_log", f"trace.path={DEEPSEEK_SAMPLE}"])
    pc = s["provider_cache"]
    assert pc["requests_compared"] == 1843 and pc["provider_cached_tokens"] == 37_700_352
    assert abs(pc["difference_pct"]) < 3.0
    assert pc["by_call_kind"]["chain_start"]["kvsim_hit_tokens"] == 0
    assert pc["per_session_left_out"] == 0 and len(pc["per_session"]) == 23


# ---------------------------------------------------------------- Weka: block sizes, absolute starts
def weka_session(sid, bs, reqs, **kw):
    return {"id": sid, "block_size": bs, "hash_id_scope": "local", "system_tokens": 0,
            "tool_tokens": 0, "requests": reqs, **kw}


def wreq(t, n_in, ids_, out=5):
    return {"t": t, "type": "n", "in": n_in, "out": out, "hash_ids": ids_, "api_time": 1.0}


def weka(path, **kw):
    return load_workload({"name": "t", "format": "weka", "path": str(path), "cache": False,
                          "session_arrival": "recorded", **kw}, 0)


def test_weka_any_declared_block_size(tmp_path):
    s = weka_session("s1", 16, [wreq(0, 100, [1, 2, 3, 4, 5, 6]),
                                wreq(5, 120, [1, 2, 3, 4, 5, 6, 7])])
    w = weka(_write(tmp_path, [s]))
    assert w.prefix_block_tokens == 16 and len(w.prefix_ids_of(1)) == 7
    assert w.notes["block_size"] == 16
    bad = weka_session("s1", 32, [wreq(0, 100, [1, 2, 3, 4])])
    with pytest.raises(TraceError, match=r"field 'hash_ids': found 4 ids, expected floor\(100/32\)=3"):
        weka(_write(tmp_path, [bad], "b.jsonl"))
    mixed = [s, weka_session("s2", 64, [wreq(0, 130, [1, 2])])]
    with pytest.raises(TraceError, match=r"m.jsonl line 2, field 'block_size': block_size differs "
                                         r"between sessions, found 64, expected 16, as line 1"):
        weka(_write(tmp_path, mixed, "m.jsonl"))
    for v in (0, True, "64", 2.5):
        with pytest.raises(TraceError, match="field 'block_size'"):
            weka(_write(tmp_path, [weka_session("s1", v, [wreq(0, 100, [1])])], "v.jsonl"))


def test_weka_absolute_session_starts(tmp_path):
    a = weka_session("s1", 64, [wreq(0, 130, [1, 2]), wreq(9, 140, [1, 2])],
                     start_time=1_700_000_100)
    b = weka_session("s2", 64, [wreq(0, 130, [1, 2])], start_time="2023-11-14T22:13:20Z")
    w = weka(_write(tmp_path, [a, b]), session_arrival="absolute")
    assert sorted(w.arrival_s[w.parent_request_id < 0].tolist()) == [0.0, 100.0]
    assert w.notes["time_origin_unix_s"] == 1_700_000_000
    # the default for Weka stays poisson (start_time is not read then)
    d = load_workload({"name": "t", "format": "weka", "path": str(tmp_path / "x.jsonl"),
                       "cache": False}, 0)
    p = load_workload({"name": "t", "format": "weka", "path": str(tmp_path / "x.jsonl"),
                       "cache": False, "session_arrival": "poisson"}, 0)
    assert d.table.equals(p.table) and d.notes["session_arrival"] == "poisson"
    del a["start_time"]
    with pytest.raises(TraceError, match=r"y.jsonl line 1, field 'start_time': missing field"):
        weka(_write(tmp_path, [a, b], "y.jsonl"), session_arrival="absolute")


# ---------------------------------------------------------------- slices that start late
def late_mooncake(tmp_path) -> Path:
    """A Mooncake-format slice whose clock starts at 1,178,625 ms (as the arXiv trace does)."""
    rows = [{"timestamp": 1_178_625 + d, "input_length": 600, "output_length": 20,
             "hash_ids": [i, 100 + i]} for i, d in enumerate((0, 2000, 2000, 9000))]
    p = tmp_path / "late.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_a_late_slice_starts_at_zero_by_default(tmp_path):
    p = late_mooncake(tmp_path)
    opts = {"name": "t", "format": "mooncake", "path": str(p), "timestamp_spread": "keep",
            "cache": False}
    w = load_workload(opts, 0)
    assert w.arrival_s.tolist() == [0.0, 2.0, 2.0, 9.0]
    assert w.notes["rebase_s"] == pytest.approx(1178.625)
    assert any("arrives at 1,178.625 s on the trace clock" in m for m in w.warnings)
    raw = load_workload({**opts, "rebase_to_first_arrival": False}, 0)
    assert raw.arrival_s.tolist() == [1178.625, 1180.625, 1180.625, 1187.625]
    assert raw.notes["rebase_s"] == 0.0 and not raw.warnings
    # a window counts from its first kept arrival
    win = load_workload({**opts, "start_s": 1180.0}, 0)
    assert win.arrival_s.tolist() == [0.0, 0.0, 7.0] and win.notes["rebase_s"] == 0.625
    # generated traces keep their clock (a benchmark client's first gap)
    b = load_workload({"name": "bench_poisson", "format": "bench", "request_rate": 4.0,
                       "num_requests": 20}, 0)
    assert b.arrival_s[0] > 0 and b.notes["rebase_s"] == 0.0


def test_throughput_counts_the_span_that_holds_requests(tmp_path):
    p = late_mooncake(tmp_path)
    on, _ = _run(tmp_path, ["trace=mooncake_conversation_10min", f"trace.path={p}",
                            "trace.timestamp_spread=keep"], name="on")
    off, req = _run(tmp_path, ["trace=mooncake_conversation_10min", f"trace.path={p}",
                               "trace.timestamp_spread=keep", "trace.rebase_to_first_arrival=false"],
                    name="off")
    assert on["trace_rebase_s"] == pytest.approx(1178.625) and off["trace_rebase_s"] == 0.0
    assert off["first_arrival_s"] == pytest.approx(1178.625) and on["first_arrival_s"] == 0.0
    assert off["sim_duration_s"] == pytest.approx(on["sim_duration_s"] + 1178.625)
    assert off["serving_span_s"] == pytest.approx(on["serving_span_s"])
    tokens = int(req["input_tokens"].sum() + req["output_tokens"].sum())
    assert off["throughput_tokens_per_s"] == pytest.approx(tokens / off["serving_span_s"])
    assert on["throughput_tokens_per_s"] == pytest.approx(off["throughput_tokens_per_s"])
