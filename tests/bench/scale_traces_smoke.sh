#!/usr/bin/env bash
# bench/llama/scale_traces.sh's variants on the CPU (2 ranks over Gloo, llama-tiny, fp32, 2 timed steps), the runs
# "variants" and "layouts" of variants.json in a temporary directory, valid against the row schema: the eleven
# rows come out (the NCCL ones plain DDP runs on Gloo), each scaled against
# tessera-single, the bf16 rows ran with the gradients reduced in bf16 (their losses after the first step
# differ from the float32 rows'), the --zero-grads zero rows trained bitwise as the default ones, and the
# --emb-grad reduce row within float32 rounding of the default (gathered) one; then VARIANTS picks the
# tp-sp and pp-zb layouts (untraced) and the stream-priority variant, into a second table.
#   scale_traces_smoke.sh BUILD_DIR
set -uo pipefail
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
BUILD=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
PYTHON=/usr/bin/python3 MODEL=llama-tiny NPROC=2 STEPS=2 B=2 RESULTS="$WORK/results" RUN=variants \
  timeout -k 10 270 bash "$(dirname "$0")/../../bench/llama/scale_traces.sh" "$BUILD" "$WORK/logs" variants || {
  echo "FAIL: bench/llama/scale_traces.sh variants failed"; exit 1; }
/usr/bin/python3 - "$WORK" "$(cd "$(dirname "$0")/../.." && pwd)" <<'PY' || exit 1
import json, os, sys
w = sys.argv[1]
sys.path.insert(0, os.path.join(sys.argv[2], "bench"))
from results_lib import schema
doc = json.load(open(os.path.join(w, "results", "variants.json")))
assert not schema.problems(doc), schema.problems(doc)
res = next(r for r in doc["runs"] if r["run"] == "variants")
rows = {r["system"]: r for r in res["rows"]}
want = ["tessera-single", "tessera-single-gqarepeat", "tessera-single-zero", "tessera-ddp", "tessera-ddp-zero", "tessera-ddp-embreduce",
        "tessera-ddp-bf16", "tessera-ddp-ctas8", "tessera-ddp-simple", "tessera-fsdp", "tessera-fsdp-bf16"]
assert sorted(rows) == sorted(want), sorted(rows)
for s in want:
    assert rows[s]["scaled_against"] == "tessera-single" and rows[s]["scaling"] > 0, rows[s]
    assert rows[s]["gpus"] == (1 if s.startswith("tessera-single") else 2), rows[s]
def losses(name):
    return [json.loads(l)["loss"] for l in open(os.path.join(w, "logs", name + ".jsonl")) if '"step"' in l]
for base in ("ddp", "fsdp"):
    f32, bf16 = losses("tessera-" + base), losses("tessera-" + base + "-bf16")
    assert f32[0] == bf16[0] and f32[1:] != bf16[1:], (base, f32, bf16)
for base in ("single", "ddp"):
    mark, zero = losses("tessera-" + base), losses("tessera-" + base + "-zero")
    assert len(mark) > 1 and mark == zero, (base, mark, zero)
gather, reduce = losses("tessera-ddp"), losses("tessera-ddp-embreduce")
assert len(gather) == len(reduce) > 1 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(gather, reduce)), (gather, reduce)
print("PASS: eleven rows scaled against tessera-single; the bf16 rows reduced in bf16; zeroed gradients train as marked")
PY
# VARIANTS: layout names run untraced, the stream-priority variant (ignored by Gloo: plain DDP) and FSDP
# gathering the tied table's rows.
VARIANTS="single tp-sp pp-zb ddp-normalprio fsdp-rows" PYTHON=/usr/bin/python3 MODEL=llama-tiny NPROC=2 STEPS=2 B=2 PP_B=4 MB=4 \
  RESULTS="$WORK/results" RUN=layouts \
  timeout -k 10 200 bash "$(dirname "$0")/../../bench/llama/scale_traces.sh" "$BUILD" "$WORK/logs2" variants || {
  echo "FAIL: bench/llama/scale_traces.sh VARIANTS=... variants failed"; exit 1; }
/usr/bin/python3 - "$WORK" <<'PY' || exit 1
import json, os, sys
doc = json.load(open(os.path.join(sys.argv[1], "results", "variants.json")))
assert [r["run"] for r in doc["runs"]] == ["variants", "layouts"], [r["run"] for r in doc["runs"]]
res = doc["runs"][1]
rows = {r["system"]: r for r in res["rows"]}
assert sorted(rows) == ["tessera-ddp-normalprio", "tessera-fsdp-rows", "tessera-pp-zb", "tessera-single", "tessera-tp-sp"], sorted(rows)
assert rows["tessera-fsdp-rows"]["mode"] == "2x1x1 fsdp", rows["tessera-fsdp-rows"]
assert "lookup rows gathered" in open(os.path.join(sys.argv[1], "logs2", "tessera-fsdp-rows.log")).read()
assert rows["tessera-tp-sp"]["mode"].startswith("1x1x2") and rows["tessera-tp-sp"]["sequence_parallel"], rows["tessera-tp-sp"]
assert rows["tessera-pp-zb"]["mode"].startswith("1x2x1") and rows["tessera-pp-zb"]["micro_batches"] == 4, rows["tessera-pp-zb"]
assert rows["tessera-ddp-normalprio"]["mode"].startswith("2x1x1"), rows["tessera-ddp-normalprio"]
assert all(r["scaled_against"] == "tessera-single" and r["scaling"] > 0 for r in rows.values()), rows
print("PASS: VARIANTS ran the tp-sp and pp-zb layouts, the stream-priority and FSDP rows variants, scaled against tessera-single")
PY
