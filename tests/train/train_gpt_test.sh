#!/usr/bin/env bash
# train_gpt against single-process training: the same model, seed and data on 1 rank (dp1 x
# pp1 x tp1) and in a parallel layout must give the same loss curve over 5 steps. Also the
# launchers (torchrun, mpirun, srun --mpi=pmix), checkpoint resume (bitwise) and resharding on
# resume. CPU and Gloo (TESSERA_BACKEND=gloo), fp32. Exit 0 pass, 1 fail, 77 skip.
#
#   train_gpt_test.sh <train_gpt> <scripts/slurm-local> <case> [nproc train_gpt-flags...]
# cases: layout <nproc> <flags>     the layout vs the 1-rank reference
#        srun                        2x2x2 (ddp) under srun --mpi=pmix -n 8 (overcommitted: the local
#                                    Slurm has as many CPUs as the machine)
#        resume <nproc> <flags>      3 steps, then resumed to 5 = 5 straight, bitwise
#        reshard <n> <flags> -- <n> <flags>   saved by one layout after 3 steps, resumed by another
#        bad_layout                  --dp 3 on 4 ranks: every rank fails naming the numbers (mpirun: exit 2)
#        bad_flags                   bad values, flags and config files: refused before any launch, exit 2,
#                                    naming the flag and the value
#        config <nproc> <flags>      the flags, the same values in a --config file, and the resolved config
#                                    the first run printed: three runs, bitwise the same losses
#        data_formats                (TESSERA_TRAIN_DATA) the dataset rewritten as llm.c shards and as a
#                                    raw token file trains bitwise like the Megatron original
#        data_mismatch               (TESSERA_TRAIN_DATA) resuming with another split: every rank refuses
#        data_vocab                  (TESSERA_TRAIN_DATA) --vocab-size 256: every rank names the token's place
#        bad_model                   heads / kv heads / FFN not fitting tp, layers not filling pp, an
#                                    unknown preset, a checkpoint of another model: each refused by every rank
#        byte_data                   (TESSERA_TRAIN_DATA) 20 Brown texts through tessera-prep's byte tokenizer
#                                    (EOD 256) train on the default model (tiny: vocabulary 512) as prepared
#        learn <steps> <bound>       (TESSERA_TRAIN_LLAMA, TESSERA_TRAIN_DATA) 2 ranks (dp) train <steps> steps:
#                                    the validation loss ends below <bound>; with a learning rate of 1e-9
#                                    (training broken) it must not
#
# Launcher (TESSERA_TRAIN_LAUNCHER): mpirun or torchrun; tests/train/CMakeLists.txt picks mpirun
# where tessera has PMIx (it starts 8 ranks in about 0.5 s, Debian's torchrun 1.13 in 4 to 8 s of
# Python) and torchrun for the tests that name it. torchrun's agent polls its workers every 0.1 s
# here (PET_MONITOR_INTERVAL; its default of 5 s adds up to 5 s to every launch).
# Reference cache (TESSERA_TRAIN_REF_CACHE, a directory): the 1-rank reference is deterministic, so
# its log is kept under a key of everything it depends on (train_gpt's and libtessera's bytes, the
# flags, the data files' sizes and times, the backend) and reused by the tests that share it.
#
set -uo pipefail

TRAIN=$1 SLURM_LOCAL=$2 CASE=$3
shift 3
LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-240}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60} TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
SLURM_DIR=${TESSERA_SLURM_DIR:-/tmp/tessera-slurm}
WORK=$(mktemp -d)
OUT=$WORK/out.txt
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../launch/lib.sh"
COMPARE=$(dirname "$0")/compare_losses.py
RTOL=1e-5
# 8 heads: tp 8 divides them (the tiny preset has 4).
BASE=(--model tiny --num-attention-heads 8 --batch 16 --steps 5 --lr 1e-2 --clip 0.3 --seed 7)
# TESSERA_TRAIN_LLAMA=1: the small Llama instead (4 heads, 2 kv heads: tp 4 replicates each kv head
# on 2 ranks; tied embeddings), T 32, with a cosine schedule after a warm-up (needs the data below);
# TESSERA_TRAIN_PRESET=moe-tiny: its mixture-of-experts twin (layers 1-3 sparse: 8 experts, top 2).
if [[ ${TESSERA_TRAIN_LLAMA:-0} == 1 ]]; then
  BASE=(--model "${TESSERA_TRAIN_PRESET:-llama-tiny}" --seq-length 32 --batch 16 --steps 5 --lr 1e-2 --lr-schedule cosine --warmup 2 --min-lr 1e-3
        --clip 0.3 --seed 7)
fi
# TESSERA_TRAIN_DATA=PREFIX: every run trains on that Megatron dataset (the Brown corpus of
# scripts/setup: SentencePiece vocabulary 4096, end-of-document token 2) instead of synthetic data.
# TESSERA_TRAIN_MODEL_FLAGS: more model flags for every run, the reference's included.
if [[ -n ${TESSERA_TRAIN_MODEL_FLAGS:-} ]]; then
  read -r -a extra <<<"$TESSERA_TRAIN_MODEL_FLAGS"
  BASE+=("${extra[@]}")
fi
DATA=${TESSERA_TRAIN_DATA:-}
if [[ -n $DATA ]]; then
  [[ -f $DATA.idx && -f $DATA.bin ]] || { echo "FAIL: $DATA.idx/.bin missing: run scripts/setup (it prepares the Brown corpus)"; exit 1; }
  BASE+=(--data "$DATA" --vocab-size 4096 --split 98,2 --eod-token 2)
fi

LAUNCHER=${TESSERA_TRAIN_LAUNCHER:-torchrun}
# launch_ranks <nproc> <args...>: train_gpt <args> on <nproc> ranks under $LAUNCHER (output in $OUT).
launch_ranks() {
  local n=$1
  shift
  case $LAUNCHER in
    mpirun) launch mpirun --allow-run-as-root --oversubscribe -np "$n" "$TRAIN" "${BASE[@]}" "$@" ;;
    torchrun)
      launch env PET_MONITOR_INTERVAL=0.1 torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node="$n" \
        --no_python "$TRAIN" "${BASE[@]}" "$@"
      ;;
    *) fail "TESSERA_TRAIN_LAUNCHER=$LAUNCHER: expected mpirun or torchrun" ;;
  esac
}

# run_ranks <log name> <nproc> <flags...>: train_gpt on <nproc> ranks, log in $WORK/<name>.jsonl
run_ranks() {
  local name=$1 n=$2
  shift 2
  launch_ranks "$n" --log-jsonl "$WORK/$name.jsonl" "$@"
  ((RC == 0)) || fail "train_gpt $* on $n ranks under $LAUNCHER exited with $RC"
}

# reference: the 1-rank run of BASE's flags as $WORK/ref.jsonl, from the cache when it holds it.
# TESSERA_TRAIN_REF_FLAGS: flags for the reference only (e.g. the micro-batches that give it the
# layout's token groups, for FP8 tensorwise scales).
read -r -a REF_FLAGS <<<"${TESSERA_TRAIN_REF_FLAGS:-}"
reference() {
  local text
  text=$(printf '%s\n' "${BASE[@]}" "${REF_FLAGS[@]}" "backend=$TESSERA_BACKEND"
         [[ -n $DATA ]] && stat -c '%n %s %Y' "$DATA.idx" "$DATA.bin")
  cached_run "$WORK/ref.jsonl" "$text" run_ranks ref 1 "${REF_FLAGS[@]}"
  # The clipping must act, or the 3-axis norm would go untested.
  python3 -c 'import json,sys; n=[json.loads(l)["grad_norm"] for l in open(sys.argv[1]) if "\"step\"" in l];
sys.exit(0 if max(n) > 0.3 else 1)' "$WORK/ref.jsonl" || fail "the reference's gradient norms stay below the clip (0.3)"
}

# expect_refusal <nproc> <regex> <flags...>: train_gpt on <nproc> ranks with <flags> fails on every
# rank, and every rank's error matches <regex> (occurrences are counted, not lines: ranks' stderr
# lines may interleave within a line). Each rank must reach its own error, so no launcher may stop
# the others at the first failure: under mpirun every rank runs in a shell that reports its exit
# status; under torchrun the agent keeps its default poll (5 s), by which time every rank has failed.
expect_refusal() {
  local n=$1 text=$2
  shift 2
  case $LAUNCHER in
    mpirun)
      launch mpirun --allow-run-as-root --oversubscribe -np "$n" \
        sh -c '"$0" "$@"; echo "train_gpt exit status $?"' "$TRAIN" "${BASE[@]}" --log-jsonl "" "$@"
      local failed
      failed=$(grep -cE "^train_gpt exit status ${EXPECT_STATUS:-[1-9]}$" "$OUT")
      ((failed == n)) || fail "train_gpt failed${EXPECT_STATUS:+ with exit status $EXPECT_STATUS} on $failed of $n ranks with $*"
      ;;
    *)
      launch torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node="$n" --no_python "$TRAIN" "${BASE[@]}" \
        --log-jsonl "" "$@"
      ((RC != 0)) || fail "train_gpt accepted $*"
      ;;
  esac
  local k
  k=$(grep -oE "$text" "$OUT" | wc -l)
  ((k == n)) || fail "$k of $n ranks said '$text' for $*"
  echo "refused by all $n ranks: $* ('$text')"
}

# to_toml <flags...>: the flags as a --config file (values quoted, switches true).
to_toml() {
  local name
  while (($# > 0)); do
    name=${1#--}
    shift
    if [[ $name == *=* ]]; then
      printf '%s = "%s"\n' "${name%%=*}" "${name#*=}"
    elif (($# == 0)) || [[ $1 == --* ]]; then
      printf '%s = true\n' "$name"
    else
      printf '%s = "%s"\n' "$name" "$1"
      shift
    fi
  done
}

# rank0_config <file>: the resolved config rank 0 printed at the start (in $OUT) into <file>.
rank0_config() {
  # torchrun's tee prefixes each line with its rank ("[default0]:"); mpirun's output has none.
  sed -n 's/^\[default0\]://; /^\[default[1-9][0-9]*\]:/d; p' "$OUT" |
    sed -n '/train_gpt: the resolved config/,/^profile = /p' | tail -n +2 >"$1"
  grep -q '^num-attention-heads = ' "$1" && grep -q '^profile = ' "$1" ||
    fail "no resolved config in the output of rank 0"
}

compare() {  # compare <log> [compare_losses options]
  local log=$1
  shift
  python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/$log.jsonl" "$@" || fail "loss curve differs from the reference"
  echo "PASS ($CASE)"
}

need "$LAUNCHER"
case $CASE in
  layout)
    n=$1
    shift
    reference
    run_ranks got "$n" "$@"
    if [[ ${TESSERA_TRAIN_MODEL_FLAGS:-} =~ --positions\ ([a-z]+) ]]; then
      grep -q "${BASH_REMATCH[1]} positions" "$WORK/got.jsonl" || fail "the model has no ${BASH_REMATCH[1]} positions"
    fi
    compare got --rtol "$RTOL"
    if [[ ${TESSERA_TRAIN_PRESET:-} == moe-tiny ]]; then  # step 1 routes the same tokens by the same weights
      python3 - "$WORK/ref.jsonl" "$WORK/got.jsonl" <<'PY' || fail "the MoE load figures of step 1 differ or are missing"
import json, sys
def first(f):
    return next(json.loads(l) for l in open(f) if '"step": 1,' in l)
a, b = first(sys.argv[1]), first(sys.argv[2])
keys = ("moe_load_max_over_mean", "moe_load_min_over_mean")
print("MoE step 1:", {k: (a.get(k), b.get(k)) for k in keys})
assert all(k in a and k in b for k in keys) and a[keys[0]] >= 1.0 >= a[keys[1]] >= 0
assert all(abs(a[k] - b[k]) <= 1e-4 for k in keys)
PY
    fi
    ;;
  fp8_layout)  # fp8_layout <nproc> <flags...>, with --fp8 in TESSERA_TRAIN_MODEL_FLAGS
    # An FP8 code flips where float32 sums taken in another order cross a rounding boundary, and
    # training amplifies the flips: step 1's loss (the forward on the same weights) within 1e-5,
    # the curve within 2e-3. Both runs cast through FP8 at every step (their logs count the values).
    n=$1
    shift
    reference
    run_ranks got "$n" "$@"
    for log in ref got; do
      python3 -c 'import json,sys; v=[json.loads(l).get("fp8_values", 0) for l in open(sys.argv[1]) if "\"step\"" in l];
sys.exit(0 if v and min(v) > 0 else 1)' "$WORK/$log.jsonl" || fail "$log.jsonl: steps without FP8 casts"
    done
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/got.jsonl" --rtol 1e-5 --steps 1-1 || fail "step 1 (the forward) differs"
    compare got --rtol 2e-3
    ;;
  bf16_reduce)  # bf16_reduce <nproc> <flags...>: --grad-reduce bf16 against the single process
    # Each rank's gradient is rounded to bf16 before the sum: step 1's loss (the forward on the same
    # weights) within 1e-5, the curve within 5e-4 (5e-5 seen). The same layout reducing in float32
    # must give other losses after step 1, or the flag changed nothing.
    n=$1
    shift
    reference
    run_ranks f32 "$n" "$@"
    run_ranks got "$n" "$@" --grad-reduce bf16
    if python3 "$COMPARE" "$WORK/f32.jsonl" "$WORK/got.jsonl" --bitwise --steps 2-5 >/dev/null; then
      fail "--grad-reduce bf16 gave the float32 reduction's losses bit for bit"
    fi
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/got.jsonl" --rtol 1e-5 --steps 1-1 || fail "step 1 (the forward) differs"
    compare got --rtol 5e-4
    ;;
  srun)
    slurm_up
    reference
    launch srun -N 1 --overcommit --kill-on-bad-exit=1 --wait=30 --mpi=pmix -n 8 "$TRAIN" "${BASE[@]}" --pp 2 --tp 2 \
      --log-jsonl "$WORK/got.jsonl"
    ((RC == 0)) || fail "srun exited with $RC"
    compare got --rtol "$RTOL"
    ;;
  resume)  # resume <nproc> <flags...>
    n=$1
    shift
    run_ranks ref "$n" "$@" --checkpoint-dir "$WORK/straight"
    run_ranks first "$n" "$@" --checkpoint-dir "$WORK/ckpt" --steps 3
    run_ranks got "$n" "$@" --checkpoint-dir "$WORK/ckpt"
    grep -q "resumed from .* at step 3" "$OUT" || fail "the second run did not resume at step 3"
    compare got --bitwise --steps 4-5
    # Both runs saved at step 5: every tensor (parameters, AdamW state) must be bitwise equal.
    S=$WORK/straight/step-5 C=$WORK/ckpt/step-5
    "${TESSERA_PYTHON:-/usr/bin/python3}" - "$S" "$C" <<'PY' || fail "the step-5 checkpoints differ"
import glob, os, sys, torch
a, b = sys.argv[1], sys.argv[2]
files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(a, "rank-*.pt")))
assert files and files == sorted(os.path.basename(f) for f in glob.glob(os.path.join(b, "rank-*.pt"))), files
n = 0
for f in files:
    x, y = torch.load(os.path.join(a, f)), torch.load(os.path.join(b, f))
    assert x.keys() == y.keys(), f
    for k in x:
        assert torch.equal(x[k], y[k]), f"{f}: {k} differs"
        n += 1
print(f"step-5 checkpoints: {n} tensors in {len(files)} rank files bitwise equal")
PY
    ;;
  reshard)  # reshard <nproc> <flags...> -- <nproc> <flags...>: saved by the first layout, resumed by the second
    a=()
    while (($# > 0)) && [[ $1 != -- ]]; do a+=("$1"); shift; done
    shift
    reference
    run_ranks first "${a[@]}" --checkpoint-dir "$WORK/ckpt" --steps 3
    run_ranks got "$@" --checkpoint-dir "$WORK/ckpt"
    grep -q "resumed from .* at step 3" "$OUT" || fail "the second layout did not resume at step 3"
    compare got --rtol "$RTOL" --steps 4-5
    ;;
  bad_layout)
    EXPECT_STATUS=2 expect_refusal 4 "error: train_gpt: dp 3 x pp 1 x tp 1 = 3 ranks, but the world has 4" --dp 3
    echo "PASS ($CASE): every rank failed with the layout's numbers"
    ;;
  bad_flags)  # (test_train_config checks every flag's refusal without starting a process)
    refused() {  # refused <text> <flags...>: train_gpt exits 2 saying <text>, before any launch
      local text=$1
      shift
      "$TRAIN" "$@" >"$OUT" 2>&1
      local rc=$?
      ((rc == 2)) || fail "train_gpt $* exited with $rc, not 2: $(cat "$OUT")"
      grep -qF -- "$text" "$OUT" || fail "train_gpt $* did not say \"$text\": $(cat "$OUT")"
      echo "refused, exit 2: $* ($text)"
    }
    refused "train_gpt: --batch expects an integer >= 1, got '0'" --batch 0
    refused "train_gpt: --data '$WORK' is a directory" --data "$WORK"
    refused "train_gpt: --dp-mode: unknown dp mode 'zero'; allowed: ddp, fsdp" --dp-mode zero
    refused "train_gpt: --sp expects no value (a switch) or one of on, off" --sp=maybe
    refused "train_gpt: unknown flag '--d': the width is --hidden-size" --d 64
    printf 'stesp = 3\n' >"$WORK/typo.toml"
    refused "train_gpt: --config '$WORK/typo.toml': unknown key 'stesp'" --config "$WORK/typo.toml"
    echo "PASS ($CASE)"
    ;;
  config)  # config <nproc> <flags...>
    n=$1
    shift
    run_ranks flags "$n" "$@"
    rank0_config "$WORK/resolved.toml"
    to_toml "${BASE[@]}" "$@" >"$WORK/same.toml"
    base=("${BASE[@]}")
    BASE=()  # every value from the file
    run_ranks file "$n" --config "$WORK/same.toml"
    run_ranks resolved "$n" --config "$WORK/resolved.toml"
    BASE=("${base[@]}")
    python3 "$COMPARE" "$WORK/flags.jsonl" "$WORK/file.jsonl" --bitwise || fail "--config of the flags trains otherwise"
    python3 "$COMPARE" "$WORK/flags.jsonl" "$WORK/resolved.jsonl" --bitwise ||
      fail "the resolved config trains otherwise"
    # The config written beside a checkpoint runs it again (elsewhere: no checkpoint, its own log).
    run_ranks saved "$n" "$@" --checkpoint-dir "$WORK/ck"
    [[ -f $WORK/ck/config.toml ]] || fail "no config.toml beside the checkpoint"
    BASE=()
    run_ranks again "$n" --config "$WORK/ck/config.toml" --checkpoint-dir ""
    BASE=("${base[@]}")
    python3 "$COMPARE" "$WORK/flags.jsonl" "$WORK/again.jsonl" --bitwise || fail "the checkpoint's config.toml trains otherwise"
    # --print-config (issue 52): the resolved config for the launcher's world, alone, nothing trained
    WORLD_SIZE=$n "$TRAIN" "${BASE[@]}" "$@" --print-config --log-jsonl "$WORK/printed.jsonl" >"$WORK/printed.toml" ||
      fail "--print-config failed"
    grep -q "^tp = " "$WORK/printed.toml" && ! grep -q "^\[tessera" "$WORK/printed.toml" ||
      fail "--print-config printed more or less than the TOML: $(head -3 "$WORK/printed.toml")"
    [[ ! -e $WORK/printed.jsonl ]] || fail "--print-config trained"
    # Without a launcher train_gpt runs alone, as rank 0 of 1 (it refused "no launcher found").
    env -u WORLD_SIZE -u RANK -u PMIX_NAMESPACE -u SLURM_PROCID "$TRAIN" "${BASE[@]}" --steps 1 \
      --log-jsonl "$WORK/alone.jsonl" >"$WORK/alone.txt" 2>&1 || fail "train_gpt alone: $(tail -3 "$WORK/alone.txt")"
    grep -q '"world": 1,' "$WORK/alone.jsonl" || fail "train_gpt alone did not run one rank"
    BASE=()
    run_ranks printed "$n" --config "$WORK/printed.toml"
    BASE=("${base[@]}")
    python3 "$COMPARE" "$WORK/flags.jsonl" "$WORK/printed.jsonl" --bitwise || fail "the printed config trains otherwise"
    echo "PASS ($CASE): flags, --config, the resolved config and the checkpoint's config.toml: the same losses"
    ;;
  legacy)  # legacy <fixture>: a checkpoint and config.toml an earlier train_gpt wrote resume bitwise
    # tests/train/fixtures/<fixture>: saved at step 4 of 8 by train_gpt at 6cef256 (killed after it),
    # and that train_gpt's uninterrupted run's steps (<fixture>_reference.jsonl).
    fixture=$(dirname "$0")/fixtures/$1
    [[ -f $fixture/config.toml ]] || fail "no fixture $fixture"
    cp -r "$fixture" "$WORK/ck"
    BASE=()  # every value from the checkpoint's config.toml
    run_ranks got 2 --config "$WORK/ck/config.toml" --checkpoint-dir "$WORK/ck"
    grep -q "resumed from $WORK/ck at step 4" "$OUT" || fail "did not resume the fixture at step 4"
    python3 "$COMPARE" "${fixture}_reference.jsonl" "$WORK/got.jsonl" --bitwise --steps 5-8 ||
      fail "steps 5-8 differ from the earlier train_gpt's"
    echo "PASS ($CASE): $1 resumed at step 4, steps 5-8 bitwise the earlier train_gpt's"
    ;;
  data_formats)
    [[ -n $DATA ]] || fail "data_formats needs TESSERA_TRAIN_DATA"
    reference
    # The same tokens as two llm.c shards (cut inside a document) and as one raw uint16 file.
    /usr/bin/python3 - "$DATA" "$WORK" <<'PY' || fail "could not rewrite the dataset"
import struct, sys
import numpy as np
prefix, out = sys.argv[1], sys.argv[2]
tokens = np.fromfile(prefix + ".bin", dtype=np.uint16)
cut = len(tokens) // 2 + 7
for i, part in enumerate((tokens[:cut], tokens[cut:])):
    with open(f"{out}/shard_{i:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
        f.write(part.tobytes())
tokens.tofile(f"{out}/train.bin")
PY
    run_ranks llmc 1 --data "$WORK/shard_*.bin"
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/llmc.jsonl" --bitwise || fail "llm.c shards train otherwise"
    run_ranks raw 1 --data "$WORK/train.bin" --data-format raw-uint16
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/raw.jsonl" --bitwise || fail "the raw file trains otherwise"
    echo "PASS ($CASE): Megatron, llm.c and raw give the same losses"
    ;;
  data_mismatch)
    [[ -n $DATA ]] || fail "data_mismatch needs TESSERA_TRAIN_DATA"
    run_ranks first 2 --checkpoint-dir "$WORK/ckpt" --steps 3
    expect_refusal 2 "error: tessera data: the checkpoint was trained on other data" --split 97,3 \
      --checkpoint-dir "$WORK/ckpt"
    grep -q "split 98,2" "$OUT" && grep -q "split 97,3" "$OUT" || fail "the error does not name both splits"
    echo "PASS ($CASE): every rank refused to resume on other data"
    ;;
  data_vocab)
    [[ -n $DATA ]] || fail "data_vocab needs TESSERA_TRAIN_DATA"
    expect_refusal 2 "outside the model's vocabulary \[0, 256\): '[^']*\.bin' sequence [0-9]+ position [0-9]+" \
      --vocab-size 256
    echo "PASS ($CASE): every rank named the out-of-vocabulary token"
    ;;
  bad_model)
    expect_refusal 4 "heads = 6 is not divisible by tp = 4" --model llama-tiny --hidden-size 96 \
      --num-attention-heads 6 --num-query-groups 2 --tp 4
    expect_refusal 2 "kv heads = 3 and tp = 2: one must divide the other" --model llama-tiny --hidden-size 96 --heads 6 \
      --kv-heads 3 --tp 2
    expect_refusal 4 "the FFN size 190 is not divisible by tp = 4" --model llama-tiny --ffn-hidden-size 190 --tp 4
    expect_refusal 4 "3 layers cannot fill pp 4" --model llama-tiny --layers 3 --pp 4
    expect_refusal 2 "unknown preset 'llama4'" --model llama4
    run_ranks first 2 --model llama-tiny --checkpoint-dir "$WORK/ckpt" --steps 2
    expect_refusal 2 "is of another model" --model llama-tiny --layers 2 --checkpoint-dir "$WORK/ckpt"
    echo "PASS ($CASE)"
    ;;
  byte_data)
    [[ -n $DATA ]] || fail "byte_data needs TESSERA_TRAIN_DATA"
    mkdir -p "$WORK/texts"
    cp $(ls "$(dirname "$DATA")"/text/* | head -20) "$WORK/texts/"
    prep=$(dirname "$0")/../../tools/tessera-prep
    /usr/bin/python3 "$prep" prepare "$WORK/texts" --tokenizer byte --output "$WORK/bytes" >"$WORK/prep.txt" 2>&1 ||
      { cat "$WORK/prep.txt"; fail "tessera-prep failed"; }
    BASE=()  # the defaults: model tiny, as a new user runs it
    run_ranks bytes 2 --data "$WORK/bytes" --steps 3
    grep -q '"step": 3' "$WORK/bytes.jsonl" || fail "no step 3"
    echo "PASS ($CASE): byte-tokenized data trains on the default model"
    ;;
  learn)  # learn <steps> <bound>
    steps=$1 bound=$2
    [[ -n $DATA ]] || fail "learn needs TESSERA_TRAIN_DATA"
    learn_run() {  # learn_run <name> <flags...>: prints the final validation loss
      local name=$1
      shift
      run_ranks "$name" 2 --steps "$steps" --eval-every "$steps" --eval-batches 8 "$@" >&2
      python3 -c 'import json,sys; v=[json.loads(l)["valid_loss"] for l in open(sys.argv[1]) if "\"step\"" in l];
print(v[-1])' "$WORK/$name.jsonl"
    }
    got=$(learn_run trained)
    frozen=$(learn_run frozen --lr 1e-9 --min-lr 0)
    echo "validation loss after $steps steps: $got (bound $bound); with a frozen learning rate: $frozen"
    python3 -c "import sys; sys.exit(0 if float('$got') < $bound <= float('$frozen') else 1)" ||
      fail "validation loss $got not below $bound, or the frozen run ($frozen) not above it"
    echo "PASS ($CASE)"
    ;;
  fp8_gap)  # fp8_gap <steps> <tolerance> <recipe>: FP8 learns as well as float32 on real data
    # The final validation loss of the FP8 run is at most <tolerance> above the run without it
    # (same seed and data), and both learned (below the untrained ln 4096 by 1).
    steps=$1 tol=$2 recipe=$3
    [[ -n $DATA ]] || fail "fp8_gap needs TESSERA_TRAIN_DATA"
    for r in off "$recipe"; do
      run_ranks "$r" 2 --steps "$steps" --eval-every "$steps" --eval-batches 8 --fp8 "$r"
    done
    python3 - "$WORK/off.jsonl" "$WORK/$recipe.jsonl" "$tol" <<'PY' || fail "FP8's validation loss is more than $tol above float32's"
import json, math, sys
def last(p): return [json.loads(l)["valid_loss"] for l in open(p) if '"step"' in l][-1]
off, fp8, tol = last(sys.argv[1]), last(sys.argv[2]), float(sys.argv[3])
print(f"validation loss: without FP8 {off:.4f}, with {fp8:.4f} (gap {fp8 - off:+.4f}, tolerance {tol})")
sys.exit(0 if fp8 - off <= tol and max(off, fp8) < math.log(4096) - 1 else 1)
PY
    echo "PASS ($CASE)"
    ;;
  *) fail "unknown case '$CASE'" ;;
esac
