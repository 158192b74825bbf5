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
#                             after_write_0, after_write_1, after_metadata, before_cleanup,
#                             before_latest): the job fails, the next run resumes from the newest
#                             complete checkpoint, and its log and losses equal an unbroken run's
#       metadata              a flipped byte in metadata.pt, a truncated one, metadata.sum missing:
#                             every rank refuses, naming the file
#       incomplete            (issue 52) the only checkpoint without its metadata.pt: every rank
#                             refuses, naming it, nothing trained or overwritten; the newest of two
#                             without it: the older one is resumed, said loudly, nothing lost
#       keep_last             step-<N> directories, `latest`, --keep-last 2, config.toml at the root;
#                             a finished run resumed says so and trains nothing
#       config_layout         (issue 52) --config ck/config.toml beside --layout (or --pp/--tp): the
#                             flags win, also on another world size, and the resume is exact
#       nan_stop, nan_skip    (issue 52) a NaN loss: the run stops on every rank naming the step,
#                             the checkpoint before it kept, the log valid JSON; skip-step skips it
#       mismatched_bin        (issue 52) a .bin of another dataset beside the .idx: every rank refuses
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
saved_step() {  # saved_step <dir>: the step of the newest checkpoint with metadata under <dir>
  /usr/bin/python3 -c 'import os, re, sys, torch
d = sys.argv[1]
steps = sorted(int(n[5:]) for n in os.listdir(d) if re.fullmatch(r"step-\d+", n)
               and os.path.exists(f"{d}/{n}/metadata.pt"))
print(torch.load(f"{d}/step-{steps[-1]}/metadata.pt")["step"] if steps else "none")' "$1"
}
no_partial_saves() {  # no_partial_saves <dir>: no step-*.tmp / step-*.old left under <dir>
  ! compgen -G "$1/step-*.tmp" >/dev/null && ! compgen -G "$1/step-*.old" >/dev/null ||
    fail "partial saves left in $1: $(ls "$1")"
}
valid_json_log() {  # valid_json_log <log>: every line is JSON (no NaN literals)
  python3 -c 'import json, sys
for n, line in enumerate(open(sys.argv[1]), 1):
    json.loads(line, parse_constant=lambda c: sys.exit(f"line {n}: {c} is not JSON"))' "$1" || fail "$1 is not JSON"
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
      before_cleanup) inject=checkpoint-before-cleanup:0 resume=4 ;;
      before_latest) inject=checkpoint-before-latest:0 resume=4 ;;
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
    grep -q "resumed from $WORK/ck/step-$resume at step $resume" "$OUT" || fail "did not resume at step $resume"
    [[ $(saved_step "$WORK/ck") == 6 && $(cat "$WORK/ck/latest") == step-6 ]] || fail "the final checkpoint is not step 6"
    no_partial_saves "$WORK/ck"
    one_record_per_step "$WORK/log.jsonl" 6
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --bitwise || fail "the losses differ from the unbroken run"
    echo "PASS ($CASE): resumed from step $resume, nothing lost"
    ;;
  metadata)
    ok_ranks 2 --batch 8 --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    meta=$WORK/ck/step-2/metadata.pt
    cp "$meta" "$WORK/pristine.pt"
    size=$(stat -c %s "$WORK/pristine.pt")
    for at in 100 $((size / 2)) $((size - 30)); do
      cp "$WORK/pristine.pt" "$meta"
      python3 -c 'import sys; p, at = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read())
b[at] ^= 1; open(p, "wb").write(b)' "$meta" "$at"
      ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
      every_rank_says 2 "metadata.pt is corrupted: its checksum differs"
    done
    cp "$WORK/pristine.pt" "$meta"
    truncate -s $((size - 5)) "$meta"
    ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    every_rank_says 2 "metadata.pt is truncated or corrupted: $((size - 5)) bytes"
    cp "$WORK/pristine.pt" "$meta"
    rm "$WORK/ck/step-2/metadata.sum"
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
    grep -q "^batch = 16$" "$OUT" || fail "the printed config does not say the batch the run uses (16)"
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
  incomplete)
    F=(--batch 8 --checkpoint-every 2)
    ok_ranks 2 "${F[@]}" --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    rm "$WORK/ck/step-2/metadata.pt"
    cp "$WORK/log.jsonl" "$WORK/log.before"
    ranks 2 "${F[@]}" --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    every_rank_says 2 "holds checkpoints but none is complete, so nothing was resumed: step-2: [^ ]*/step-2/metadata.pt is missing"
    [[ -f $WORK/ck/step-2/rank-0.pt && ! -e $WORK/ck/step-4 ]] || fail "the damaged checkpoint was touched or a new one saved"
    cmp -s "$WORK/log.jsonl" "$WORK/log.before" || fail "the log was rewritten"
    # Two checkpoints, the newest without its metadata: the older one is resumed, said loudly.
    rm -rf "$WORK/ck" "$WORK/log.jsonl"
    reference "$WORK/ref.jsonl" 2 "${F[@]}" --steps 6
    ok_ranks 2 "${F[@]}" --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    rm "$WORK/ck/step-4/metadata.pt"
    ok_ranks 2 "${F[@]}" --steps 6 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    grep -q "CHECKPOINT FALLBACK: passed over newer checkpoints that cannot be read: step-4: .*metadata.pt is missing" \
      "$OUT" || fail "the fallback was not said"
    grep -q "resumed from $WORK/ck/step-2 at step 2" "$OUT" || fail "did not resume at step 2"
    one_record_per_step "$WORK/log.jsonl" 6
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --bitwise || fail "the losses differ from the unbroken run"
    echo "PASS ($CASE)"
    ;;
  keep_last)
    ok_ranks 2 --batch 8 --checkpoint-every 1 --keep-last 2 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    [[ $(cd "$WORK/ck" && echo step-*) == "step-3 step-4" ]] || fail "kept $(ls "$WORK/ck"), not step-3 and step-4"
    [[ $(cat "$WORK/ck/latest") == step-4 && -f $WORK/ck/config.toml ]] || fail "no latest or config.toml at the root"
    cmp -s "$WORK/ck/config.toml" "$WORK/ck/step-4/config.toml" || fail "the root's config.toml is not the newest's"
    ok_ranks 2 --batch 8 --steps 4 --checkpoint-dir "$WORK/ck" --log-jsonl ""
    grep -q "nothing to train: the checkpoint in $WORK/ck/step-4 is at step 4 and --steps is 4" "$OUT" ||
      fail "a finished run resumed did not say so"
    ok_ranks 2 --batch 8 --steps 6 --lr-schedule cosine --checkpoint-dir "$WORK/ck" --log-jsonl ""
    grep -q "THE LR SCHEDULE CHANGES on resume: the checkpoint was trained toward 4 steps" "$OUT" ||
      fail "a stretched schedule was not said"
    grep -q "train_gpt: done: steps 5..6 of 6" "$OUT" || fail "no summary"
    echo "PASS ($CASE)"
    ;;
  config_layout)
    reference "$WORK/ref.jsonl" 4 --tp 2 --steps 4
    ok_ranks 4 --layout 1x2x2 --batch 16 --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    cp -r "$WORK/ck" "$WORK/ck2"
    cp "$WORK/log.jsonl" "$WORK/log2.jsonl"
    ok_ranks 4 --config "$WORK/ck/config.toml" --layout 4x1x1 --steps 4 --log-jsonl "$WORK/log.jsonl"
    grep -q '"dp": 4, "pp": 1, "tp": 1' <(grep '"event": "config"' "$WORK/log.jsonl" | tail -1) ||
      fail "--layout beside --config did not win"
    ok_ranks 2 --config "$WORK/ck2/config.toml" --pp 1 --tp 1 --steps 4 --checkpoint-dir "$WORK/ck2" \
      --log-jsonl "$WORK/log2.jsonl"
    grep -q '"dp": 2, "pp": 1, "tp": 1' <(grep '"event": "config"' "$WORK/log2.jsonl" | tail -1) ||
      fail "--pp 1 --tp 1 beside --config did not give dp 2 on 2 ranks"
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log.jsonl" --rtol 1e-5 || fail "the 4x1x1 resume trains otherwise"
    python3 "$COMPARE" "$WORK/ref.jsonl" "$WORK/log2.jsonl" --rtol 1e-5 || fail "the 2x1x1 resume trains otherwise"
    echo "PASS ($CASE)"
    ;;
  nan_stop)
    ok_ranks 2 --batch 8 --checkpoint-every 1 --steps 2 --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    TESSERA_FAULT_INJECT=nan-loss-at-step-4:1 ranks 2 --batch 8 --checkpoint-every 1 --steps 6 \
      --checkpoint-dir "$WORK/ck" --log-jsonl "$WORK/log.jsonl"
    every_rank_says 2 "step 4: the loss is nan and the gradient norm [0-9.]+: not finite, so the run stops"
    grep -q "the last checkpoint, $WORK/ck/step-3, is kept as it was" "$OUT" || fail "the kept checkpoint was not named"
    [[ $(saved_step "$WORK/ck") == 3 && $(cat "$WORK/ck/latest") == step-3 ]] || fail "a checkpoint after the NaN was saved"
    valid_json_log "$WORK/log.jsonl"
    grep -q '"step": 4, "loss": null,.*"nonfinite": true, "skipped": false' "$WORK/log.jsonl" || fail "no NaN record"
    echo "PASS ($CASE)"
    ;;
  nan_skip)
    TESSERA_FAULT_INJECT=nan-loss-at-step-2:0 ok_ranks 2 --batch 8 --steps 4 --nan-policy skip-step \
      --log-jsonl "$WORK/log.jsonl"
    grep -q "step 2: the loss or the gradient norm is not finite: update skipped" "$OUT" || fail "the skip was not said"
    grep -q "1 update(s) skipped" "$OUT" || fail "the summary does not count the skip"
    valid_json_log "$WORK/log.jsonl"
    grep -q '"step": 2, .*"nonfinite": true, "skipped": true' "$WORK/log.jsonl" || fail "no skipped record"
    python3 -c 'import json, sys, math
s = [json.loads(l) for l in open(sys.argv[1]) if "\"event\": \"step\"" in l]
assert [r["step"] for r in s] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in s if r["step"] != 2), s' \
      "$WORK/log.jsonl" || fail "the steps after the skipped one are not finite"
    # (item 14) a fresh run on the same log keeps the earlier run's records
    ok_ranks 2 --batch 8 --steps 1 --log-jsonl "$WORK/log.jsonl"
    grep -q "held an earlier run's records: kept as $WORK/log.1.jsonl" "$OUT" || fail "the earlier log was not kept"
    [[ $(grep -c '"event": "step"' "$WORK/log.1.jsonl") == 4 && $(grep -c '"event": "step"' "$WORK/log.jsonl") == 1 ]] ||
      fail "the earlier log was overwritten"
    echo "PASS ($CASE)"
    ;;
  mismatched_bin)
    # (issue 52, item 3) the corpus's .idx beside a .bin of twice its tokens, as another dataset's
    cp "$DATA.idx" "$WORK/other.idx"
    cat "$DATA.bin" "$DATA.bin" >"$WORK/other.bin"
    ranks 2 --batch 8 --steps 1 --data "$WORK/other" --log-jsonl ""
    every_rank_says 2 "describes [0-9]+ bytes of tokens, but its .bin has [0-9]+ \(the .bin and .idx of different"
    echo "PASS ($CASE)"
    ;;
  *) fail "unknown row '$CASE'" ;;
esac
