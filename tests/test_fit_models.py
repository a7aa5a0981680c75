"""``fit`` with third-party model code: accumulation equals one large batch, Hugging Face
batches and outputs, DDP without needless all-reduces. Models are built from configs."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
import transformers
from checkpoint_helpers import differences
from torch import nn
from torch.utils.data import DataLoader

from ipycloud.runtime.train import distributed
from ipycloud.runtime.train.loop import fit

logging.getLogger("transformers").setLevel(logging.ERROR)


def reference_step(model: nn.Module, batches: list[Any], lr: float, loss_of: Any) -> None:
    """One SGD step on the micro-batches joined into one batch, in float64."""
    joined = [torch.cat(parts) for parts in zip(*batches, strict=True)] \
        if isinstance(batches[0], tuple) else {
            key: torch.cat([batch[key] for batch in batches]) for key in batches[0]}
    model.zero_grad()
    loss_of(model, joined).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= lr * parameter.grad


def largest_gap(trained: nn.Module, reference: nn.Module) -> float:
    return max(float((mine.double() - theirs).abs().max().detach()) for mine, theirs in
               zip(trained.parameters(), reference.parameters(), strict=True))


def test_a_short_last_group_and_a_short_last_batch_weigh_as_one_large_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(38, 5, generator=generator)
    labels = inputs[:, :3].argmax(dim=1)
    batches = [(inputs[start:start + 4], labels[start:start + 4]) for start in range(0, 38, 4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    reference = copy.deepcopy(model).double()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.5), batches, epochs=1, grad_accum=4,
        precision="fp32", device="cpu", progress=False)
    for start in range(0, 10, 4):  # groups of 4, 4 and 2 batches (the last of 2 samples)
        reference_step(reference, [(x.double(), y) for x, y in batches[start:start + 4]], 0.5,
                       lambda net, batch: nn.functional.cross_entropy(net(batch[0]), batch[1]))
    assert largest_gap(model, reference) < 1e-5


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=40,
                                     n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def padded_lm_batches() -> list[dict[str, torch.Tensor]]:
    """Micro-batches of 2 rows padded to 12 tokens, with very different numbers of labels."""
    generator = torch.Generator().manual_seed(1)
    batches = []
    for lengths in ([12, 11], [3, 2], [12, 12], [4, 2], [9, 2], [2, 3], [12, 7], [5, 5]):
        ids = torch.randint(1, 40, (2, 12), generator=generator)
        mask = torch.zeros(2, 12, dtype=torch.long)
        for row, length in enumerate(lengths):
            mask[row, :length] = 1
        batches.append({"input_ids": ids, "attention_mask": mask,
                        "labels": ids.masked_fill(mask == 0, -100)})
    return batches


def test_token_level_losses_accumulate_as_one_large_batch() -> None:
    model = tiny_gpt2()
    reference = copy.deepcopy(model).double()
    batches = padded_lm_batches()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.5), batches, epochs=1, grad_accum=4,
        precision="fp32", device="cpu", progress=False)
    for start in (0, 4):
        reference_step(reference, batches[start:start + 4], 0.5,
                       lambda net, batch: net(**batch).loss)
    assert largest_gap(model, reference) < 1e-5


def word_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["good", "bad", "film", "very", "not", "plot", "great", "awful"]
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: index + 2 for index, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]",
                                                unk_token="[UNK]")


REVIEWS = [("very good film", 1), ("bad plot", 0), ("great", 1), ("not good", 0),
           ("awful film", 0), ("very great plot", 1), ("bad", 0), ("good film", 1)] * 4


def tiny_bert() -> nn.Module:
    config = transformers.BertConfig(vocab_size=10, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=2)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def test_batch_encodings_from_a_collator_are_keyword_arguments() -> None:
    tokenizer = word_tokenizer()
    items = [dict(tokenizer(text), label=label) for text, label in REVIEWS]
    data = DataLoader(items, batch_size=8, shuffle=True,
                      collate_fn=transformers.DataCollatorWithPadding(tokenizer))
    assert type(next(iter(data))).__name__ == "BatchEncoding"
    model = tiny_bert()
    history = fit(model, torch.optim.AdamW(model.parameters(), lr=1e-2), data, epochs=3,
                  val_data=data, device="cpu", progress=False)
    assert 0.0 <= history.epochs[-1]["val_accuracy"] <= 1.0  # a classifier gets accuracy
    assert history.epochs[-1]["train_loss"] < history.epochs[0]["train_loss"]


def test_outputs_without_a_loss_use_cross_entropy_on_their_logits() -> None:
    tokenizer = word_tokenizer()
    encoded = tokenizer([text for text, _ in REVIEWS], padding=True, return_tensors="pt")
    labels = torch.tensor([label for _, label in REVIEWS])
    batches = [({key: value[start:start + 8] for key, value in encoded.items()},
                labels[start:start + 8]) for start in range(0, len(REVIEWS), 8)]
    def train(**loss: Any) -> tuple[nn.Module, Any]:
        model = tiny_bert()
        assert model(**batches[0][0]).loss is None
        history = fit(model, torch.optim.AdamW(model.parameters(), lr=1e-2), batches,
                      epochs=2, val_data=batches, device="cpu", progress=False, **loss)
        return model, history

    model, history = train()
    explicit, _ = train(loss_fn=lambda outputs, labels: nn.functional.cross_entropy(
        outputs.logits, labels))
    assert differences(model.state_dict(), explicit.state_dict()) == []
    assert "val_accuracy" in history.epochs[-1]


def test_a_batch_of_three_parts_says_how_to_shape_it() -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError) as caught:
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
            [(torch.randn(2, 4), torch.zeros(2, dtype=torch.long), torch.ones(2))],
            device="cpu", progress=False, loss_fn=nn.functional.cross_entropy)
    message = str(caught.value)
    assert "a batch of 3 items is ambiguous" in message and "loss_fn" not in message


def _count_all_reduces(grad_accum: int) -> int:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = []
    wrap = distributed.wrap_for_distributed

    def counting_wrap(model: nn.Module, device: Any) -> Any:
        wrapped = wrap(model, device)

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations
            calls.append(1)
            return default_hooks.allreduce_hook(None, bucket)

        wrapped.register_comm_hook(None, hook)
        return wrapped

    distributed.wrap_for_distributed = counting_wrap  # in this forked rank only
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    batches = [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(8)]
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=1,
        grad_accum=grad_accum, device="cpu", progress=False)
    return len(calls)


def test_under_ddp_only_the_last_micro_batch_of_a_step_all_reduces() -> None:
    assert distributed.launch(_count_all_reduces, 4, nprocs=2) == [2, 2]  # 2 steps of 4
    assert distributed.launch(_count_all_reduces, 1, nprocs=2) == [8, 8]
