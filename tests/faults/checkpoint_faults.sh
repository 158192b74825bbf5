#!/usr/bin/env bash
# The checkpoint rows of the fault table (docs/testing.md): real faults on real train_gpt
# processes (the small Llama on the Brown corpus, CPU, Gloo), each asserting the exit statuses,
# what the ranks say, and that no checkpoint step and no log record is lost. Exit 0 pass, 1 fail,
# 77 skip.
#
#   checkpoint_faults.sh <train_gpt> <row>
# rows: fsdp_eval_save_llama  FSDP 2x1x2 with validation on the steps that save: the run ends with its
#                             checkpoint (it died at unshardAll before)
#       fsdp_eval_save_gpt    the same for the GPT, dp 2
#       killed_<point>        a save killed at one file of the protocol (TESSERA_FAULT_INJECT points:
#                             after_write_0, after_write_1, after_metadata, between_renames,
#                             before_cleanup): the job fails, the next run resumes from the newest
#                             complete checkpoint, and its log and losses equal an unbroken run's
#       metadata              a flipped byte in metadata.pt, a truncated one, metadata.sum missing:
#                             every rank refuses, naming the file
#       layout_batch          a dp2 x tp2 checkpoint resumed as dp4 keeps its global batch (16, not 8·4),
#                             losses as the unbroken run; --batch 32 changes it and is said loudly
#       log_resume            rank 0 killed after step 5 (checkpoints every 3): the resumed run's log
#                             holds every step once, as the unbroken run's
# Launcher (TESSERA_TRAIN_LAUNCHER): mpirun (default where present) or torchrun.
set -uo pipefail

TRAIN=$1 CASE=$2
LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-180}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-30} TESSERA_BACKEND=gloo OMP_NUM_THREADS=1 TESSERA_EXIT_GRACE_S=2
WORK=$(mktemp -d)
OUT=$WORK/out.txt
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../launch/lib.sh"
COMPARE=$(dirname "$0")/../train/compare_losses.py
DATA=${TESSERA_TRAIN_DATA:-$(dirname "$0")/../../data/brown/brown_sp4096_text_document}
[[ -f $DATA.idx && -f $DATA.bin ]] || fail "$DATA.idx/.bin missing: run scripts/setup (it prepares the Brown corpus)"
BASE=(--model llama-tiny --seq-len 32 --data "$DATA" --vocab 4096 --split 98,2 --eod-token 2 --lr 1e-2 --clip 0.3
      --seed 7)
LAUNCHER=${TESSERA_TRAIN_LAUNCHER:-mpirun}
command -v "$LAUNCHER" >/dev/null || LAUNCHER=torchrun
need "$LAUNCHER"

# ranks <n> <flags...>: train_gpt on <n> ranks; RC is the job's exit status, the output in $OUT.
# Under mpirun every rank runs in a shell that prints its own exit status ("rank exit status N").
ranks() {
  local n=$1
  shift
  case $LAUNCHER in
    mpirun)
      launch mpirun --allow-run-as-root --oversubscribe -np "$n" \
        sh -c '"$0" "$@"; echo "rank exit status $?"' "$TRAIN" "${BASE[@]}" "$@"
      ;;
    *)
      launch env PET_MONITOR_INTERVAL=0.1 torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node="$n" \
        --no_python "$TRAIN" "${BASE[@]}" "$@"
      ;;
  esac
}
# job_failed: true when a rank failed (mpirun: the ranks' own statuses; else the launcher's).
job_failed() {
  ((RC != 0)) || grep -qE "^rank exit status [1-9]" "$OUT"
}
ok_ranks() {  # ok_ranks <n> <flags...>: must succeed
  ranks "$@"
  ! job_failed || fail "train_gpt ${*:2} on $1 ranks failed (exit status $RC)"
}
# every_rank_says <n> <regex>: under mpirun, every rank exited non-zero and the output has <regex>
# n times (under torchrun: the job failed and <regex> appears at least once).
every_rank_says() {
  local n=$1 text=$2 k
  job_failed || fail "the job succeeded; expected every rank to fail with '$text'"
  k=$(grep -oE "$text" "$OUT" | wc -l)
  if [[ $LAUNCHER == mpirun ]]; then
    local failed
    failed=$(grep -cE "^rank exit status [1-9]" "$OUT")
    ((failed == n)) || fail "$failed of $n ranks failed"
    ((k == n)) || fail "$k of $n ranks said '$text'"
  else
    ((k >= 1)) || fail "no rank said '$text'"
  fi
  echo "every rank refused: '$text'"
}
# reference <log> <n> <flags...>: an unbroken run's log, from TESSERA_TRAIN_REF_CACHE when it holds
# the run of these flags (lib.sh's cached_run): the killed_* rows share one.
reference() {
  local log=$1 n=$2 text
  shift 2
  text=$(printf '%s\n' "$n" "${BASE[@]}" "$@" "$LAUNCHER"; stat -c '%n %s %Y' "$DATA.idx" "$DATA.bin")
  cached_run "$log" "$text" ok_ranks "$n" "$@" --log-jsonl "$log"
}
# one_record_per_step <log> <steps>: steps 1..<steps> each exactly once, nothing else numbered.
one_record_per_step() {
  python3 - "$1" "$2" <<'PY' || fail "the log $1 does not hold each step once"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"event": "step"' in l]
want = list(range(1, int(sys.argv[2]) + 1))
assert steps == want, f"step records {steps}, want {want}"
print(f"{sys.argv[1]}: steps 1..{sys.argv[2]} once each")
PY
}
saved_step() {  # saved_step <dir>: the step of the checkpoint a resume would load (<dir> or <dir>.old)
  /usr/bin/python3 -c 'import os, sys, torch
d = sys.argv[1]
d = d if os.path.exists(d + "/metadata.pt") else d + ".old"
print(torch.load(d + "/metadata.pt")["step"])' "$1"
}

case $CASE in
  fsdp_eval_save_llama | fsdp_eval_save_gpt)
    if [[ $CASE == *gpt ]]; then
      BASE+=(--model tiny --vocab 4096)
      n=2 layout=(--layout 2x1x1)
    else
      n=4 layout=(--layout 2x1x2 --sp)
    fi
    ok_ranks "$n" "${layout[@]}" --dp-mode fsdp --eval-every 2 --checkpoint-every 3 --steps 6 --batch 8 \
      --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    [[ $(saved_step "$WORK/ck") == 6 ]] || fail "no checkpoint of step 6"
    grep -q '"valid_loss": [0-9]' "$WORK/log.jsonl" || fail "no validation ran"
    echo "PASS ($CASE): validation and saves on the same steps, checkpoint of step 6 written"
    ;;
  killed_*)
    point=${CASE#killed_}
    case $point in
      after_write_0) inject=checkpoint-after-write:0 resume=2 ;;
      after_write_1) inject=checkpoint-after-write:1 resume=2 ;;
      after_metadata) inject=checkpoint-after-metadata:0 resume=2 ;;
      between_renames) inject=checkpoint-between-renames:0 resume=2 ;;
      before_cleanup) inject=checkpoint-before-cleanup:0 resume=4 ;;
      *) fail "unknown point $point" ;;
    esac
    F=(--batch 8 --checkpoint-every 2 --steps 6)
    reference "$WORK/ref.jsonl" 2 "${F[@]}"
    ok_ranks 2 "${F[@]}" --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    # Resumed at 2, the save of step 4 killed at the point.
    TESSERA_FAULT_INJECT=$inject ranks 2 "${F[@]}" --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    job_failed || fail "the job survived TESSERA_FAULT_INJECT=$inject"
    grep -q "TESSERA_FAULT_INJECT: rank . kills itself" "$OUT" || fail "the fault was not injected"
    [[ $(saved_step "$WORK/ck") == "$resume" ]] || fail "the newest complete checkpoint is not step $resume"
    ok_ranks 2 "${F[@]}" --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    grep -q "resumed from $WORK/ck\(.old\)\? at step $resume" "$OUT" || fail "did not resume at step $resume"
    [[ ! -e $WORK/ck.old && $(saved_step "$WORK/ck") == 6 ]] || fail "the final checkpoint is not step 6 at ck"
    one_record_per_step "$WORK/log.jsonl" 6
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --bitwise || fail "the losses differ from the unbroken run"
    echo "PASS ($CASE): resumed from step $resume, nothing lost"
    ;;
  metadata)
    ok_ranks 2 --batch 8 --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    cp "$WORK/ck/metadata.pt" "$WORK/pristine.pt"
    size=$(stat -c %s "$WORK/pristine.pt")
    for at in 100 $((size / 2)) $((size - 30)); do
      cp "$WORK/pristine.pt" "$WORK/ck/metadata.pt"
      python3 -c 'import sys; p, at = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read())
b[at] ^= 1; open(p, "wb").write(b)' "$WORK/ck/metadata.pt" "$at"
      ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
      every_rank_says 2 "metadata.pt is corrupted: its checksum differs"
    done
    cp "$WORK/pristine.pt" "$WORK/ck/metadata.pt"
    truncate -s $((size - 5)) "$WORK/ck/metadata.pt"
    ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    every_rank_says 2 "metadata.pt is truncated or corrupted: $((size - 5)) bytes"
    cp "$WORK/pristine.pt" "$WORK/ck/metadata.pt"
    rm "$WORK/ck/metadata.sum"
    ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    every_rank_says 2 "metadata.sum is missing"
    echo "PASS ($CASE)"
    ;;
  layout_batch)
    reference "$WORK/ref.jsonl" 4 --tp 2 --steps 6
    ok_ranks 4 --tp 2 --steps 3 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    cp -r "$WORK/ck" "$WORK/ck2"
    ok_ranks 4 --steps 6 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    grep -q "keeping the checkpoint's global batch of 16 sequences" "$OUT" || fail "no word of the kept batch"
    grep -q '"batch": 16' <(grep '"event": "config"' "$WORK/log.jsonl" | tail -1) || fail "the resumed run's batch is not 16"
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --rtol 1e-5 || fail "dp4 resumed otherwise than the dp2 x tp2 run"
    ranks 4 --steps 4 --batch 32 --checkpoint-dir "$WORK/ck2" --log-jsonl ""
    ! job_failed || fail "--batch 32 on resume failed"
    grep -q "THE GLOBAL BATCH CHANGES on resume: .* trained with 16 sequences a step, this run takes 32" "$OUT" ||
      fail "a changed global batch was not said"
    echo "PASS ($CASE)"
    ;;
  log_resume)
    F=(--batch 8 --checkpoint-every 3 --steps 8)
    reference "$WORK/ref.jsonl" 2 "${F[@]}"
    TESSERA_FAULT_INJECT=kill-after-step-5:0 ranks 2 "${F[@]}" --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    job_failed || fail "the job survived the kill of rank 0"
    python3 -c 'import json,sys; s=[json.loads(l)["step"] for l in open(sys.argv[1]) if "\"step\"" in l]
assert s == [1, 2, 3, 4, 5], s' "$WORK/log.jsonl" || fail "the killed run did not log steps 1..5"
    ok_ranks 2 "${F[@]}" --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    one_record_per_step "$WORK/log.jsonl" 8
    grep -q '"event": "resume", "step": 3,.*"dropped_records": 2' "$WORK/log.jsonl" || fail "no resume record"
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --bitwise || fail "the log's losses differ from the unbroken run"
    echo "PASS ($CASE)"
    ;;
  *) fail "unknown row '$CASE'" ;;
esac
