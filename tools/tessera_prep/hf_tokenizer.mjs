// tessera-prep's bridge to Hugging Face tokenizer.json files: @huggingface/tokenizers (the npm
// package, a pure JavaScript implementation of the tokenizers library: BPE, WordPiece, Unigram,
// their normalizers, pre-tokenizers, post-processors and decoders) run by Node.js.
//   node hf_tokenizer.mjs TOKENIZER_JSON
// Reads tokenizer_config.json beside it when present. Then one JSON request per stdin line, one
// JSON answer per stdout line, in order:
//   {"info": true}     -> {"vocab_size": N, "eos_id": id|-1, "bos_id": id|-1}
//   {"encode": "text"} -> {"ids": [...]}   (the tokenizer's special tokens added, as transformers does)
//   {"decode": [ids]}  -> {"text": "..."}  (special tokens skipped)
// A failure answers {"error": "..."} (a malformed file: the first answer) and the process goes on.
import { readFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { Tokenizer } from "@huggingface/tokenizers";

const path = process.argv[2];
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
let tok = null, info = null, loadError = null;
try {
  const json = JSON.parse(readFileSync(path, "utf8"));
  const configPath = join(dirname(path), "tokenizer_config.json");
  const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
  tok = new Tokenizer(json, config);
  const special = (v) => (v && typeof v === "object" ? v.content : v);
  const idOf = (t) => (t ? tok.token_to_id(special(t)) ?? -1 : -1);
  let size = 0;
  for (const id of tok.get_vocab(true).values()) size = Math.max(size, id + 1);
  info = { vocab_size: size, eos_id: idOf(config.eos_token), bos_id: idOf(config.bos_token) };
} catch (e) {
  loadError = `${path}: ${e.message}`;
}
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line) continue;
  if (loadError) {
    out({ error: loadError });
    continue;
  }
  try {
    const req = JSON.parse(line);
    if (req.info) out(info);
    else if (req.encode !== undefined) out({ ids: tok.encode(req.encode).ids });
    else if (req.decode !== undefined) out({ text: tok.decode(req.decode, { skip_special_tokens: true }) });
    else out({ error: `unknown request ${line.slice(0, 80)}` });
  } catch (e) {
    out({ error: e.message });
  }
}
