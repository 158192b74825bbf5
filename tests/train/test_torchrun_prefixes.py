"""No train_gpt flag may be caught by torchrun's own parser.

torchrun parses its command line with argparse, abbreviations allowed, and argparse classifies
every argument string, the program's too: a program flag that is a prefix of two torchrun options
is refused ("ambiguous option: --d could match --duplicate-stdout-filters, --duplicate-stderr-
filters"), and of one, taken as that option by some Python versions. So no flag or alias of
train_gpt --help may be a prefix of a torchrun option: of the torchrun found here (Debian's 1.13 on
the CPU machines, the image's on the GPU machine) and of torch 2.11's (TORCHRUN_2_11 below, from
pytorch's torch/distributed/run.py). -h/--help are left out: exact matches, which argparse leaves
to the program, and train_gpt --help runs without a launcher.

  TRAIN_GPT=build/bin/train_gpt python3 -m pytest tests/train/test_torchrun_prefixes.py
"""
import argparse
import os
import re
import subprocess

import pytest

# torch 2.11's torchrun options (torch/distributed/run.py, get_args_parser), with those of later
# versions of main (--shutdown-timeout, --virtual-local-rank, --log-line-prefix-template).
TORCHRUN_2_11 = """
-h --help --nnodes --nproc-per-node --nproc_per_node --rdzv-backend --rdzv_backend
--rdzv-endpoint --rdzv_endpoint --rdzv-id --rdzv_id --rdzv-conf --rdzv_conf --standalone
--max-restarts --max_restarts --monitor-interval --monitor_interval --start-method --start_method
--event-log-handler --event_log_handler --role -m --module --no-python --no_python --run-path
--run_path --log-dir --log_dir -r --redirects -t --tee --local-ranks-filter --local_ranks_filter
--duplicate-stdout-filters --duplicate_stdout_filters --duplicate-stderr-filters
--duplicate_stderr_filters --node-rank --node_rank --master-addr --master_addr --master-port
--master_port --local-addr --local_addr --logs-specs --logs_specs --numa-binding --numa_binding
--signals-to-handle --signals_to_handle --shutdown-timeout --shutdown_timeout
--virtual-local-rank --virtual_local_rank --log-line-prefix-template --log_line_prefix_template
""".split()
HELP = {"-h", "--help"}


def train_gpt_flags():
    exe = os.environ.get("TRAIN_GPT", "build/bin/train_gpt")
    out = subprocess.run([exe, "--help"], check=True, capture_output=True, text=True,
                         env=dict(os.environ, TESSERA_BACKEND="gloo")).stdout
    flags = set()
    for line in out.splitlines():
        m = re.match(r"\s+(-[-\w]+(?:,-[-\w]+)*)", line)
        if m:
            flags.update(m.group(1).split(","))
    assert {"--hidden-size", "--num-layers", "--batch", "--config", "--sp"} <= flags, sorted(flags)
    return sorted(flags - HELP)


def local_torchrun_parser():
    """The parser of the torchrun found here (None without torch)."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError:
        return None
    return get_args_parser()


def parser_of(options):
    """An argparse parser with torchrun's shape: these options, the script, the rest."""
    p = argparse.ArgumentParser(exit_on_error=False)
    for o in options:
        if o not in HELP:
            p.add_argument(o, dest=o.lstrip("-").replace("-", "_") + "_" + str(len(o)))
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


PARSERS = {"torchrun 2.11": parser_of(TORCHRUN_2_11)}
if local_torchrun_parser() is not None:
    PARSERS["the local torchrun"] = local_torchrun_parser()
FLAGS = train_gpt_flags()


def options(parser):
    return sorted(parser._option_string_actions)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_no_flag_is_a_prefix_of_a_torchrun_option(name):
    opts = options(PARSERS[name])
    caught = {f: [o for o in opts if o.startswith(f)] for f in FLAGS}
    caught = {f: o for f, o in caught.items() if o}
    assert not caught, f"train_gpt flags that are prefixes of {name}'s options: {caught}"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_argparse_leaves_every_flag_to_the_program(name):
    parser = PARSERS[name]
    for f in FLAGS:
        for args in ([f, "1"], [f + "=1"]):
            # parse_args exits on an ambiguous option whatever exit_on_error says (Python 3.11)
            try:
                got = parser.parse_args(["build/bin/train_gpt", *args])
            except SystemExit as e:
                pytest.fail(f"{name} refused train_gpt {' '.join(args)} (exit {e.code})")
            assert got.training_script_args == args, (name, args, got)


def test_the_old_width_flag_is_gone():
    # --d: ambiguous under torch 2.11 (--duplicate-stdout-filters, --duplicate-stderr-filters)
    assert "--d" not in FLAGS
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parser_of(TORCHRUN_2_11).parse_args(["build/bin/train_gpt", "--d", "64"])
