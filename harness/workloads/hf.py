"""A Hugging Face transformers model built from a local config: no download, no weights.

    workload:
      hf: {config: model/config.json, task: causal-lm}   # or a folder holding config.json
      params: {seq_len: 128}                             # other params override config fields

The model is `AutoModelFor<task>.from_config(config)` with random weights, trained on random
token ids (labels: the ids for the LM tasks, a class for sequence classification), or on the
spec's `batch:` function (a dict of model inputs holding `labels`). `checkpointing: full` is the
model's own `gradient_checkpointing_enable()`; `selective` wraps every other repeated block.
"""
from __future__ import annotations

import os

import torch

from harness import knobs
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

    def build(params: dict) -> Workload:
        params = dict(params)
        seq_len, lr = int(params.pop("seq_len", 128)), float(params.pop("lr", 1e-4))
        config = transformers.AutoConfig.from_pretrained(hf["config"], **params)
        model = auto.from_config(config)
        model.train()
        fn = batch_fn or random_tokens(config, hf.get("task", "causal-lm"))
        blocks, about = find_blocks(model)
        return Workload(model=model, dataset=BatchDataset(fn, {"seq_len": seq_len}), collate=first_item,
                        loss=lambda m, batch: m(**batch).loss, blocks=blocks, about=about, lr=lr,
                        tokens_per_sample=seq_len, checkpoint=lambda m, mode: checkpoint(m, mode, blocks, about))
    return build


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
    return knobs.apply_checkpointing(model, blocks, mode)

