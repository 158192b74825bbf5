#!/usr/bin/env bash
# tessera_generate end to end on the CPU: train_gpt trains llama-tiny a few steps on the Brown
# corpus on 2 ranks (tp 2) and saves a checkpoint; tessera_generate continues a prompt from it
# greedily as one process (the tp 2 checkpoint resharded to tp 1) and on 2 ranks (tp 2) under the
# launcher, with the same ids; tools/tessera-generate with --prompt TEXT and the corpus's
# SentencePiece model prints the prompt, the ids and the text, and a seed reproduces a sampled
# continuation. Bad input is refused with a clear error: no checkpoint, an HF directory, a prompt
# id outside the vocabulary, top-p outside (0, 1], more positions than a GPT's learned ones.
# Exit 0 pass, 1 fail, 77 skip.
#
#   generate_test.sh <train_gpt> <tessera_generate>
# Environment: TESSERA_TRAIN_DATA (the Brown corpus's Megatron prefix), TESSERA_TRAIN_LAUNCHER
# (mpirun or torchrun; as train_gpt_test.sh).
set -uo pipefail

TRAIN=$1 GEN=$2
CASE=generate
LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-240}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60} TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
WORK=$(mktemp -d)
OUT=$WORK/out.txt
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../launch/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FRONT=$ROOT/tools/tessera-generate
DATA=${TESSERA_TRAIN_DATA:-$ROOT/data/brown/brown_sp4096_text_document}
TOKENIZER=$(dirname "$DATA")/brown_sp4096.model
[[ -f $DATA.idx && -f $TOKENIZER ]] || fail "$DATA.idx or $TOKENIZER missing: run scripts/setup (it prepares the Brown corpus)"
LAUNCHER=${TESSERA_TRAIN_LAUNCHER:-torchrun}
need "$LAUNCHER"

# on_ranks <nproc> <command...> under $LAUNCHER (output in $OUT)
on_ranks() {
  local n=$1
  shift
  case $LAUNCHER in
    mpirun) launch mpirun --allow-run-as-root --oversubscribe -np "$n" "$@" ;;
    *) launch env PET_MONITOR_INTERVAL=0.1 torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node="$n" \
         --no_python "$@" ;;
  esac
}
# expect_error <exit status> <regex> <command...>: the command fails with that status and says it.
expect_error() {
  local want=$1 text=$2
  shift 2
  launch "$@"
  ((RC == want)) || fail "expected exit status $want from $*, got $RC"
  grep -qE -- "$text" "$OUT" || fail "no '$text' in the error of $*"
  echo "refused: $* ('$text')"
}
ids_of() { grep -oE '(^|:)ids: [0-9,]*' "$OUT" | sed 's/.*ids: //'; }

CKPT=$WORK/llama
on_ranks 2 "$TRAIN" --model llama-tiny --data "$DATA" --split 98,2 --eod-token 2 --batch 4 --steps 3 --lr 3e-3 --tp 2 \
  --checkpoint-dir "$CKPT" --log-jsonl ""
((RC == 0)) || fail "train_gpt exited with $RC"

PROMPT=505,429,621,271,3825  # "The Fulton County"
launch "$GEN" "$CKPT" --prompt-ids $PROMPT --max-new-tokens 8
((RC == 0)) || fail "tessera_generate exited with $RC"
one=$(ids_of)
[[ $(tr ',' '\n' <<<"$one" | grep -c .) == 8 ]] || fail "expected 8 ids on one rank, got '$one'"
on_ranks 2 "$GEN" "$CKPT" --prompt-ids $PROMPT --max-new-tokens 8
((RC == 0)) || fail "tessera_generate on 2 ranks exited with $RC"
two=$(ids_of)
[[ $one == "$two" ]] || fail "tp 2 continued with '$two', tp 1 with '$one'"
echo "greedy: tp 1 and tp 2 continue with $one"

sample=(--prompt "The Fulton County Grand Jury said" --tokenizer "$TOKENIZER" --max-new-tokens 12 --temperature 0.8
        --top-p 0.9 --seed 3)
launch "$FRONT" "$CKPT" "${sample[@]}"
((RC == 0)) || fail "tools/tessera-generate exited with $RC"
grep -q '^prompt: The Fulton County Grand Jury said$' "$OUT" || fail "no prompt line"
grep -qE '^ids: [0-9]+(,[0-9]+)*$' "$OUT" || fail "no ids line"
grep -q '^text: ' "$OUT" || fail "no text line"
first=$(grep -E '^(ids|text):' "$OUT")
launch "$FRONT" "$CKPT" "${sample[@]}"
[[ $(grep -E '^(ids|text):' "$OUT") == "$first" ]] || fail "the same seed sampled another continuation"
echo "sampled (reproduced): $first"

expect_error 1 "no such directory" "$GEN" "$WORK/none" --prompt-ids 1,2
mkdir -p "$WORK/hf" && echo '{}' >"$WORK/hf/config.json"
expect_error 1 "field 'hidden_size' is missing" "$GEN" "$WORK/hf" --prompt-ids 1,2
expect_error 1 "prompt id 4096 is outside the vocabulary \[0, 4096\)" "$GEN" "$CKPT" --prompt-ids 1,4096
expect_error 2 "top-p must be in \(0, 1\], got 1.5" "$GEN" "$CKPT" --prompt-ids 1,2 --top-p 1.5
expect_error 2 "--prompt TEXT needs a tokenizer: --tokenizer FILE .*, or one of those in $CKPT" "$FRONT" "$CKPT" \
  --prompt "The jury"
# A tokenizer in the model directory is taken without --tokenizer (as Hugging Face directories carry one).
mkdir -p "$WORK/withtok" && cp -r "$CKPT"/. "$WORK/withtok/" && cp "$TOKENIZER" "$WORK/withtok/tokenizer.model"
launch "$FRONT" "$WORK/withtok" --prompt "The Fulton County Grand Jury said" --max-new-tokens 4
((RC == 0)) && grep -q '^text: ' "$OUT" || fail "the model directory's tokenizer.model was not used"
"$FRONT" --help | grep -q -- "--max-new-tokens" || fail "--help does not show --max-new-tokens"
# A GPT with learned positions (T 32): 30 prompt + new tokens fit, 33 do not.
on_ranks 1 "$TRAIN" --model tiny --seq-len 32 --steps 1 --checkpoint-dir "$WORK/gpt" --log-jsonl ""
((RC == 0)) || fail "train_gpt (GPT) exited with $RC"
launch "$GEN" "$WORK/gpt" --prompt-ids 1,2,3 --max-new-tokens 27
((RC == 0)) || fail "30 positions of the GPT's 32 were refused"
expect_error 1 "past the model's 32 learned positions" "$GEN" "$WORK/gpt" --prompt-ids 1,2,3 --max-new-tokens 30
echo "PASS ($CASE)"
