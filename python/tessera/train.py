"""Training a GPT or Llama from Python with the same trainer ``train_gpt`` runs (src/train).

::

    import tessera
    from tessera import train

    tessera.init()
    cfg = train.Config(model="llama-tiny", tp=2, dp_mode="fsdp", steps=100, lr=3e-3,
                       data="data/brown/brown_sp4096_text_document", vocab_size=4096, split="98,2")
    trainer = train.Trainer(cfg)
    reports = trainer.fit()               # or: trainer.restore(); trainer.log(trainer.step()); ...; trainer.save()

:class:`Config` takes ``train_gpt``'s flags as keyword arguments (``--dp-mode fsdp`` is
``dp_mode="fsdp"``; a switch takes ``True``/``False``; a list takes a list), or a TOML file of them
(:meth:`Config.from_toml`, the ``config.toml`` every checkpoint holds), with the same defaults,
checks and errors (:class:`tessera.train.UsageError` names the flag and the value). Every layout,
schedule (zero bubble included), context parallel, FP8, Hugging Face import/export and
asynchronous checkpoints are the C++ trainer's: there is no Python copy of them. With the same
config a Python run equals ``train_gpt``'s bitwise.

Your own ``torch.nn.Module`` trains with tessera's wrappers instead (:mod:`tessera.parallel`,
:mod:`tessera.nn`, :mod:`tessera.checkpoint`; python/README.md).
"""
import tomllib

from . import _C

UsageError = _C.train.UsageError
# A NaN or infinite loss or gradient norm ended the run (nan_policy="stop"; "skip-step" skips them).
NonFiniteError = _C.train.NonFiniteError
StepReport = _C.train.StepReport


def _flag_args(fields):
    """train_gpt's argv for keyword fields: ``dp_mode="fsdp"`` -> ``--dp-mode=fsdp``."""
    args = []
    for key, value in fields.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        args.append(f"{flag}={value}")
    return args


class Config:
    """A run's configuration: train_gpt's flags by keyword (``Config(tp=2, steps=50)``)."""

    def __init__(self, **fields):
        self._c = _C.train.Config.parse(_flag_args(fields))

    @classmethod
    def from_args(cls, args):
        """train_gpt's command line (``["--tp", "2", "--config", "run.toml"]``)."""
        cfg = cls.__new__(cls)
        cfg._c = _C.train.Config.parse([str(a) for a in args])
        return cfg

    @classmethod
    def from_toml(cls, path, **overrides):
        """The flags of a TOML file (``train_gpt --config``); keyword overrides win."""
        cfg = cls.__new__(cls)
        cfg._c = _C.train.Config.parse(["--config", str(path)] + _flag_args(overrides))
        return cfg

    def to_toml(self):
        """Every flag's value as ``name = value`` lines (what :meth:`from_toml` reads back)."""
        return self._c.to_toml()

    def as_dict(self):
        """The flags' values by TOML key (``"dp-mode"``, ``"hidden-size"``, ...)."""
        return tomllib.loads(self.to_toml())

    def __getitem__(self, key):
        return self.as_dict()[key.replace("_", "-")]

    def describe(self):
        return self._c.describe()

    @property
    def help(self):
        """``--help`` was among the flags (print :func:`usage`)."""
        return self._c.help

    def __repr__(self):
        return f"tessera.train.Config({self._c.describe()})"


def usage():
    """train_gpt --help's text: every flag with its default on this machine."""
    return _C.train.usage()


class Trainer:
    """The C++ Trainer over ``config`` (src/train/trainer.h). Construction and every method are
    collective over the world of ``context`` (default: :func:`tessera.init`'s): every rank makes
    one and calls the same methods in the same order. Reports are :class:`StepReport`\ s (``step``,
    ``loss``, ``grad_norm``, ``lr``, ``step_ms``, ``tokens_per_s``, ``mfu``, ``peak_mem_gib``,
    ``valid_loss``, ...).
    """

    def __init__(self, config, context=None):
        if context is None:
            from . import _default_context
            context = _default_context
            if context is None:
                raise _C.Error("tessera.train.Trainer: call tessera.init() first or pass context=")
        self.config = config
        self._t = _C.train.Trainer(config._c, context)

    def fit(self, on_step=None):
        """The configured run (restore, steps, validation, checkpoints, exports); returns the reports."""
        return self._t.fit(on_step)

    def step(self, tokens=None, targets=None):
        """One step on the next batch of the configured data, or on this rank's ``tokens``/``targets``."""
        if tokens is None and targets is None:
            return self._t.step()
        if tokens is None or targets is None:
            given, missing = ("tokens", "targets") if targets is None else ("targets", "tokens")
            raise ValueError(f"tessera.train.Trainer.step: {given} without {missing}: pass both (this rank's rows "
                             "of a global batch) or neither (the next batch of the configured data)")
        return self._t.step_on(tokens, targets)

    def log(self, report):
        """The progress line (rank 0) and the JSONL record of a step's report, as fit() writes them."""
        self._t.log(report)

    def restore(self):
        """Loads the checkpoint in the configured directory if there is one; whether it did."""
        return self._t.restore()

    def evaluate(self):
        return self._t.evaluate()

    def save(self):
        self._t.save()

    def export_hf(self, directory):
        self._t.export_hf(str(directory))

    @property
    def steps_done(self):
        return self._t.steps_done
