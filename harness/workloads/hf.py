"""A Hugging Face transformers model built from a local config: no download, no weights.

    workload:
      hf: {config: model/config.json, task: causal-lm}   # or a folder holding config.json
      params: {seq_len: 128}                             # other params override config fields

The model is `AutoModelFor<task>.from_config(config)` with random weights, trained on random
token ids (labels: the ids for the LM tasks, a class for sequence classification), or on the
spec's `batch:` function (a dict of model inputs holding `labels`). `checkpointing: full` is the
model's own `gradient_checkpointing_enable()`; `selective` wraps every other repeated block.

The steps are a real `transformers.Trainer`'s, with the user's TrainingArguments (the apply
target's YAML/JSON, when the spec has one): bench's knobs become its arguments (batch size,
accumulation, bf16/fp16, gradient_checkpointing, torch_compile, dataloader workers and pinning),
`max_steps` is beyond any trial and the trial (harness.trainer) ends training, saving, logging and
evaluation are off, and batches come in order so the first one is the fp32 reference's.
`loop: bench` trains the model in bench's own loop instead.
"""
from __future__ import annotations

import os
import tempfile

import torch

from harness import transforms
from harness.errors import did_you_mean
from harness.workloads import Workload, load_factory
from harness.workloads.own import BatchDataset, find_blocks, first_item

TASKS = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
         "sequence-classification": "AutoModelForSequenceClassification"}


def adapter(section: dict):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local config only: never reach the network
    import transformers

    hf = section["hf"]
    auto = getattr(transformers, TASKS[hf.get("task", "causal-lm")])
    batch_fn = load_factory(section["batch"]) if section.get("batch") else None
    in_trainer = section.get("loop", "trainer") == "trainer"
    user_args = dict(section.get("training_args") or {})

    def build(params: dict) -> Workload:
        params, params_given = dict(params), set(params)
        seq_len, lr = int(params.pop("seq_len", 128)), float(params.pop("lr", 1e-4))
        config, unused = transformers.AutoConfig.from_pretrained(hf["config"], return_unused_kwargs=True, **params)
        check_fields([k for k in unused if k in section.get("strict", ())], config, hf["config"])
        model = auto.from_config(config)
        model.train()
        if batch_fn is None:
            check_positions(seq_len, config, model, hf["config"], every_config="seq_len" not in params_given)
        fn = batch_fn or random_tokens(config, hf.get("task", "causal-lm"))
        blocks, about = find_blocks(model)
        dataset = BatchDataset(fn, {"seq_len": seq_len}, TRAINER_SAMPLES if in_trainer else 1 << 30)
        if in_trainer:
            about["loop"] = "transformers.Trainer"

        def trainer(config, trial):
            fit(transformers, model, dataset, blocks, about, user_args, config, trial)
        return Workload(model=model, dataset=dataset, collate=first_item,
                        loss=lambda m, batch: m(**batch).loss, blocks=blocks, about=about, lr=lr,
                        tokens_per_sample=seq_len, checkpoint=lambda m, mode: checkpoint(m, mode, blocks, about),
                        trainer=trainer if in_trainer else None)
    return build


def check_fields(unknown: list, config, path: str) -> None:
    """Params the config has no field for: AutoConfig drops them, and a typo would measure another model."""
    if unknown:
        from harness.trial import UserFacingError
        fields = config.to_dict()
        said = ", ".join(k + did_you_mean(k, fields) for k in unknown)
        raise UserFacingError(f"workload params {said}: no field of {type(config).__name__} ({path}); "
                              "spell them as the config does, or remove them", every_config=True)


def check_positions(seq_len: int, config, model, path: str, every_config: bool) -> None:
    """Random token ids longer than a learned position table (GPT-2's wpe, BERT's position_embeddings, OPT's)
    fail inside its embedding (`IndexError: index out of range in self`): say it in the spec's terms
    instead. Rotary positions (Llama) have no table and run at any length: left alone."""
    positions = getattr(config, "max_position_embeddings", None)
    if not (isinstance(positions, int) and 0 < positions < seq_len):
        return
    # OPT's table holds 2 rows more than its positions (an offset kept from fairseq)
    if any(isinstance(m, torch.nn.Embedding) and positions <= m.num_embeddings <= positions + 2 for m in model.modules()):
        from harness.trial import UserFacingError
        default = "" if not every_config else " (bench's default; set workload.params.seq_len)"
        raise UserFacingError(f"seq_len {seq_len}{default} is longer than {type(config).__name__}'s "
                              f"{positions} positions (max_position_embeddings, {path}); use a seq_len of at "
                              f"most {positions}", every_config=every_config)


# The Trainer's sampler draws a permutation of the whole dataset: keep it small (more epochs are fine).
TRAINER_SAMPLES = 1 << 16
# TrainingArguments the trial sets itself; the user's values for these are left out (and said in the record).
BENCH_OWNS = ("output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "tf32",
              "gradient_checkpointing", "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_mode",
              "max_steps", "num_train_epochs", "save_strategy", "logging_strategy", "eval_strategy", "report_to",
              "disable_tqdm", "use_cpu", "train_sampling_strategy", "push_to_hub", "load_best_model_at_end",
              "resume_from_checkpoint", "do_eval", "logging_dir")
TRIAL_MAX_STEPS = 1_000_000  # beyond any trial, so the user's schedule is finite; the trial ends training


def fit(transformers, model, dataset, blocks, about, user_args, config, trial) -> None:
    """transformers.Trainer.train() with the user's TrainingArguments and the trial's knobs, until the
    trial stops it."""
    if config.get("checkpointing") == "selective":
        checkpoint(model, "selective", blocks, about)
    reference = trial.reference_loss(model.to(trial.device))  # fp32, the first batch (sequential order)
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as root:
        args, dropped = training_arguments(user_args, config, trial.device, root)
        if dropped:
            about["training_args_set_by_bench"] = dropped
        if config.get("checkpointing") == "full":
            about["checkpointing"] = "TrainingArguments.gradient_checkpointing (non-reentrant)"
        trainer = measured_trainer(transformers, trial)(
            model=model, args=transformers.TrainingArguments(**args), train_dataset=dataset,
            data_collator=first_item, callbacks=[meter_callback(transformers, trial, model, reference)])
        trainer.train()


def training_arguments(user_args: dict, config: dict, device: torch.device, root: str) -> tuple[dict, list[str]]:
    precision = config.get("precision", "fp32")
    compile_mode = config.get("compile", "off")
    args = {k: v for k, v in user_args.items() if k not in BENCH_OWNS}
    args.update(output_dir=root, per_device_train_batch_size=int(config["batch_size"]),
                gradient_accumulation_steps=int(config.get("accumulation", 1)),
                bf16=precision == "bf16-mixed", fp16=precision == "fp16-mixed", tf32=None,  # transforms.set_numerics
                gradient_checkpointing=config.get("checkpointing") == "full",
                gradient_checkpointing_kwargs={"use_reentrant": False},
                torch_compile=compile_mode != "off",
                torch_compile_mode=None if compile_mode in ("off", "default") else compile_mode,
                max_steps=max(int(user_args.get("max_steps") or -1), TRIAL_MAX_STEPS),
                save_strategy="no", logging_strategy="no", eval_strategy="no", report_to="none",
                disable_tqdm=True, use_cpu=device.type == "cpu", train_sampling_strategy="sequential")
    if "num_workers" in config:
        args["dataloader_num_workers"] = int(config["num_workers"])
    if "pin_memory" in config:
        args["dataloader_pin_memory"] = bool(config["pin_memory"])
    return args, sorted(k for k in user_args if k in BENCH_OWNS)


def measured_trainer(transformers, trial):
    """transformers.Trainer that hands each micro-batch's loss to the meter."""

    class MeasuredTrainer(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss = out[0] if return_outputs else out
            # given the step's item count, the model divides by all of them: a micro-batch's share of the mean
            share = num_items_in_batch is not None and self.model_accepts_loss_kwargs
            trial.meter.pending.append(loss.detach().float() * (self.current_gradient_accumulation_steps if share else 1))
            return out
    return MeasuredTrainer


def meter_callback(transformers, trial, model, reference: dict):
    """bench's meter inside the Trainer: the gate at each optimizer step."""

    class BenchMeter(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            if state.global_step == 0 and not trial.meter.losses and not trial.meter.pending:
                trial.started(model, optimizer, reference)
            trial.gate.step_start()

        def on_step_end(self, args, state, control, **kwargs):
            trial.gate.step_end()
    return BenchMeter()


def random_tokens(config, task: str):
    def batch(batch_size: int, seq_len: int) -> dict:
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        if task == "sequence-classification":
            return {"input_ids": ids, "labels": torch.randint(0, config.num_labels, (batch_size,))}
        return {"input_ids": ids, "labels": ids.clone()}
    return batch


def checkpoint(model, mode: str, blocks: tuple, about: dict):
    """`full`: the model's own gradient checkpointing (what TrainingArguments.gradient_checkpointing
    turns on); `selective`: bench wraps every other repeated block, which transformers cannot do."""
    if mode == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        about["checkpointing"] = f"gradient_checkpointing_enable(): {model.is_gradient_checkpointing}"
        return model
    about["checkpointing"] = "bench wraps every other block"
    return transforms.apply_checkpointing(model, blocks, mode)

