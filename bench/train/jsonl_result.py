"""Turns a train_gpt JSONL log into the benchmarks' RESULT line (bench/result_lines.py):
the median step time of the steps after the first WARM (3), as the anchors' method, and the
peak memory of the fullest rank.
  python3 jsonl_result.py LOG.jsonl SYSTEM [WARM]"""
import json
import sys


def main():
    path, system = sys.argv[1], sys.argv[2]
    warm = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    cfg, steps = {}, []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "config":
                cfg = r
            elif r.get("event") == "step":
                steps.append(r)
    timed = steps[warm:]
    if not timed:
        print(f"{path}: {len(steps)} steps, none after {warm} warm-ups", file=sys.stderr)
        return 1
    times = sorted(s["step_ms"] for s in timed)
    med = times[len(times) // 2]
    at = min(timed, key=lambda s: abs(s["step_ms"] - med))
    tokens = cfg["batch"] * cfg["seq_len"]
    res = dict(system=system, mode=f"{cfg['dp']}x{cfg['pp']}x{cfg['tp']} {cfg['dp_mode']}", world=cfg["world"],
               params_M=round(cfg["params"] / 1e6, 1), step_ms=round(med, 2), tokens_per_s=round(tokens / med * 1e3),
               mfu_vs_989=at["mfu"] and round(at["mfu"] * med / at["step_ms"], 3),
               peak_mem_GiB=round(max(s["peak_mem_gib"] for s in steps), 2), batch=cfg["batch"],
               micro_batches=cfg["micro_batches"], sequence_parallel=cfg["sequence_parallel"],
               bubble_ms_est=at["bubble_ms_est"], dp_sync_ms_est=at["dp_sync_ms_est"],
               optimizer_ms=at["optimizer_ms"], last_loss=round(steps[-1]["loss"], 4),
               step_ms_all=[round(s["step_ms"], 2) for s in timed])
    print("RESULT", json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
