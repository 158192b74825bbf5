#!/usr/bin/env bash
# One GPU, communication emulated (TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_TIMED=1 TESSERA_FAKE_COMM_CTAS=16) with the
# collectives' kernels sleeping (TESSERA_FAKE_COMM_TRAFFIC=0) or streaming memory (=1) for their modelled
# time: does the memory traffic (and the power it draws at the GPU's power cap) slow the step the
# way two real GPUs did? The GPU's SM clock and power are sampled (nvidia-smi, every 200 ms) and
# averaged over each run.
#   bench/traffic_probe.sh BUILD_DIR OUT_DIR     (writes OUT_DIR/runs.log, smi.csv, traffic.md)
# Runs, alternating the two modes: DDP (view+fused, fused+bf16, base), FSDP (prefetch 512 MiB),
# TP with sequence parallel (carve16, ring+carve16) and plain (carve16, base); and the 1-GPU
# reference (fused, base, view+fused). About 4 minutes on an H200.
set -uo pipefail
B=${1:?build dir}
OUT=${2:?out dir}
mkdir -p "$OUT"
L="$OUT/runs.log"
: > "$L"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 200 \
  > "$OUT/smi.csv" 2>&1 &
smi=$!
run() {  # run ENV... CMD...: one process, its window in the log
  echo "== start $(date '+%Y/%m/%d %H:%M:%S.%N') $*" >> "$L"
  env STEPS=20 "$@" >> "$L" 2>&1 || echo "== failed rc=$?" >> "$L"
  echo "== end $(date '+%Y/%m/%d %H:%M:%S.%N')" >> "$L"
}
E=(TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_TIMED=1 TESSERA_FAKE_COMM_CTAS=16)
run B=8 "$B/bench/tessera_bench_ddp" single --variants fused,base,view+fused
for t in 0 1 0 1; do
  run "${E[@]}" TESSERA_FAKE_COMM_TRAFFIC=$t B=8 "$B/bench/tessera_bench_ddp" tessera --variants view+fused,fused+bf16,base
done
for t in 0 1; do
  run "${E[@]}" TESSERA_FAKE_COMM_TRAFFIC=$t B=8 "$B/bench/tessera_bench_fsdp" --prefetch-mib 512
  run "${E[@]}" TESSERA_FAKE_COMM_TRAFFIC=$t B=16 "$B/bench/tessera_bench_tp" --sp --variants carve16,ring+carve16
  run "${E[@]}" TESSERA_FAKE_COMM_TRAFFIC=$t B=16 "$B/bench/tessera_bench_tp" --variants carve16,base
done
kill $smi 2>/dev/null
python3 - "$L" "$OUT/smi.csv" > "$OUT/traffic.md" <<'PY'
import datetime as dt, json, sys
fmt = "%Y/%m/%d %H:%M:%S.%f"
smi = []
for line in open(sys.argv[2]):
    p = [x.strip() for x in line.split(",")]
    try:
        smi.append((dt.datetime.strptime(p[0], fmt), float(p[1].split()[0]), float(p[2].split()[0])))
    except (ValueError, IndexError):
        pass
print("| run | system | step ms | SM MHz | W |")
print("|---|---|---|---|---|")
rows, start, cmd = [], None, ""
for line in open(sys.argv[1]):
    if line.startswith("== start "):
        start, cmd = dt.datetime.strptime(line[9:35], fmt), line[36:].strip()
        rows = []
    elif "RESULT" in line:
        rows.append(json.loads(line.split("RESULT", 1)[1]))
    elif line.startswith("== end "):
        end = dt.datetime.strptime(line[7:33], fmt)
        busy = [s for s in smi if start <= s[0] <= end and s[2] > 300]  # while the GPU works
        mhz = sum(s[1] for s in busy) / len(busy) if busy else float("nan")
        watts = sum(s[2] for s in busy) / len(busy) if busy else float("nan")
        mode = "traffic" if "FAKE_COMM_TRAFFIC=1" in cmd else "sleep" if "FAKE_COMM_TRAFFIC=0" in cmd else "1 GPU"
        for r in rows:
            print(f"| {mode} | {r['system']} | {r['step_ms']:.2f} | {mhz:.0f} | {watts:.0f} |")
PY
cat "$OUT/traffic.md"
