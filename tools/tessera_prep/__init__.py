"""tessera_prep: data preparation for tessera's training data loaders.

Modules: inputs (documents from text files, directories and JSONL), tokenizers (byte-level and
SentencePiece, and SentencePiece training), formats (Megatron and llm.c writers), readers
(validating readers used by inspect and decode), progress (a plain-text progress bar),
commands (the subcommands) and cli (argument parsing).
"""


class PrepError(Exception):
    """Bad input or a malformed dataset; the message names the file and what is wrong."""


LOG_PREFIX = "[tessera-prep]"
