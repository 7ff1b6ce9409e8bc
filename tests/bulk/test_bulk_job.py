"""The bulk job, against an exported tiny model: input order, refill equal to decoding alone, one output line per
input line, a validated GenerationConfig, resumption after SIGKILL, ``shard=i/n`` splits and the DDP path."""

import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_config, decode_alone, tiny_model

from hybrid.bulk import BulkJob, ShardStore, count_sources, decode_shard, read_sources, run_bulk
from hybrid.cli.generate import run_generate
from hybrid.generation.config import GenerationConfig
from hybrid.generation.refill import RefillDecoder
from hybrid.tokenizer import Seq2SeqTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
ALPHABET = "abcdefghij"
GREEDY = {"max_new_tokens": 12}
SAMPLED = {"max_new_tokens": 12, "do_sample": True, "top_k": 0, "temperature": 1.5}


def words(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(ALPHABET, k=rng.randint(0 if i % 97 == 5 else 1, 12))) for i in range(count)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A folder that ``hybrid generate ckpt_path=...`` loads: a tiny random model and its tokenizer."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = Seq2SeqTokenizer.train([ALPHABET], [ALPHABET])
    tiny_model(["lstm", "attention"], seed=1, vocab_size=tokenizer.vocab_size).save_pretrained(folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(exported):
    from hybrid.training.checkpoint import load_for_inference

    return load_for_inference(exported)


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def hybrid(*args: str, cwd: Path, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "hybrid.cli", "generate", *args], cwd=cwd, input=stdin,
                            capture_output=True, text=True, timeout=timeout, env=ONE_THREAD)
    assert result.returncode == 0, f"hybrid generate {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_records_end_at_newlines_only_so_output_line_i_answers_input_line_i(loaded, tmp_path):
    # A bare carriage return inside a line, a CRLF line and a blank line: three inputs, three outputs.
    (tmp_path / "in.txt").write_bytes(b"ab\rcd\nxy\r\n\n")
    assert list(read_sources(tmp_path / "in.txt")) == ["ab\rcd", "xy", ""]
    assert count_sources(tmp_path / "in.txt") == 3
    model, tokenizer = loaded
    job = BulkJob.for_model(model, GREEDY, max_tokens=36, window=15, shard_size=2)
    assert run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), job, progress=False)
    assert (tmp_path / "out.txt").read_bytes().count(b"\n") == 3
    assert tokenizer.encode_source("") == [tokenizer.eos_id]  # the blank line encodes to its eos alone...
    assert (tmp_path / "out.txt").read_text().split("\n")[2] == ""  # ...and is answered by an empty line


BAD_INPUT = b"abc\n\xff\xfe\n" + b"ab" * 600 + b"\nde\n"  # invalid UTF-8, then a source past max_positions


@pytest.mark.parametrize("on_error", ["empty", "skip"])
def test_one_bad_line_never_kills_a_job(loaded, tmp_path, on_error):
    model, tokenizer = loaded
    assert model.config.max_positions < 1200
    (tmp_path / "in.txt").write_bytes(BAD_INPUT)
    job = BulkJob.for_model(model, GREEDY, shard_size=2, on_error=on_error)
    assert run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), job, progress=False)
    out = (tmp_path / "out.txt").read_text().split("\n")[:-1]
    good = [decode_alone(model, tokenizer, text, **GREEDY) for text in ("abc", "de")]
    assert out == ([good[0], "", "", good[1]] if on_error == "empty" else good)
    rejects = (tmp_path / "out.txt.rejects.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in rejects] == ["2", "3"]
    assert "UTF-8" in rejects[0] and "max_positions" in rejects[1]


def test_on_error_fail_stops_naming_the_line(loaded, tmp_path):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_bytes(BAD_INPUT)
    with pytest.raises(ValueError, match=r"in.txt:2: the line is not valid UTF-8 \(on_error=fail"):
        run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                 BulkJob.for_model(model, GREEDY, on_error="fail"), progress=False)
    with pytest.raises(ValueError, match="on_error must be one of"):
        BulkJob(on_error="ignore")


def test_a_job_carries_one_validated_generation_config_over_the_models_defaults(loaded):
    model, _ = loaded
    assert BulkJob.for_model(model, GREEDY).generation == GenerationConfig(max_new_tokens=12)
    with_defaults = copy.deepcopy(model)
    with_defaults.generation_config = {"max_new_tokens": 3, "forced_bos_token_id": 5}
    assert BulkJob.for_model(with_defaults, {"min_new_tokens": 1, "forced_bos_token_id": 6}).generation == (
        GenerationConfig(min_new_tokens=1, max_new_tokens=3, forced_bos_token_id=6))  # an option given wins
    with pytest.raises(ValueError, match="min_new_tokens \\(4\\) must not exceed max_new_tokens \\(3\\)"):
        BulkJob.for_model(with_defaults, {"min_new_tokens": 4})  # valid alone, not over these defaults
    with pytest.raises(ValueError, match="num_beams must be a positive int"):
        BulkJob(generation=GenerationConfig(num_beams=0))  # a config built by hand is checked too
    with pytest.raises(TypeError, match="generation must be a GenerationConfig, got dict"):
        BulkJob(generation=GREEDY)
    with pytest.raises(ValueError, match=r"cannot take \['logits_processor'\]"):
        BulkJob(generation=GenerationConfig(logits_processor=[lambda ids, scores: scores]))


def test_a_bad_option_fails_before_anything_is_decoded_or_written(exported, tmp_path):

    model = shutil.copytree(exported, tmp_path / "model", ignore=shutil.ignore_patterns("fast"))
    (tmp_path / "in.txt").write_text("abc\n")
    cfg = compose_config([f"ckpt_path={model}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                          "generation.num_beams=2", "generation.num_return_sequences=3", "optimize=true"],
                         tmp_path, config_name="generate")
    with pytest.raises(ValueError, match=r"num_return_sequences \(3\) must be <= num_beams \(2\)"):
        run_generate(cfg)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "model"]  # no output, no work folder
    assert not (model / "fast").exists()  # nor the fast path's cache


@pytest.mark.parametrize("refill, options, count", [(True, GREEDY, 40), (False, GREEDY, 40),
                                                    (False, {**GREEDY, "num_beams": 2}, 12)],
                         ids=["refill", "bucketed", "beams"])
def test_output_is_in_input_order_and_as_if_each_source_were_alone(loaded, tmp_path, refill, options, count):
    model, tokenizer = loaded
    sources = words(count, seed=2)
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n")
    job = BulkJob.for_model(model, options, max_tokens=36, window=15, refill=refill, shard_size=25)
    assert run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), job, progress=False)
    expected = [decode_alone(model, tokenizer, text, **options) for text in sources]
    assert (tmp_path / "out.txt").read_text().split("\n")[:-1] == expected
    assert not (tmp_path / "out.txt.parts").exists()  # merged, then cleaned up


def test_pad_token_id_is_never_generated_by_the_refilled_command_line(exported, loaded, tmp_path):
    # The id the model emits most often becomes the padding: `hybrid generate` (refill on, the default)
    # must then ban it exactly as generate(pad_token_id=K) does, and the outputs must change.
    model, tokenizer = loaded
    sources = words(23, seed=9)
    generated = [model.generate(torch.tensor([tokenizer.encode_source(text)]), **GREEDY)[0]
                 for text in sources if text]
    counts = torch.bincount(torch.cat(generated), minlength=model.config.vocab_size)
    counts[[model.config.pad_id, model.config.bos_id, model.config.eos_id]] = 0
    pad = int(counts.argmax())
    assert not RefillDecoder.obstacles(model, **GREEDY, pad_token_id=pad)  # the job really refills
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n")
    hybrid(f"ckpt_path={exported}", "input=in.txt", "output=out.txt", "max_new_tokens=12", f"pad_token_id={pad}",
           "progress=false", cwd=tmp_path)
    lines = (tmp_path / "out.txt").read_text().split("\n")[:-1]
    assert lines == [decode_alone(model, tokenizer, text, **GREEDY, pad_token_id=pad) for text in sources]
    assert lines != [decode_alone(model, tokenizer, text, **GREEDY) for text in sources]


def test_the_command_line_runs_the_fast_path_and_gets_the_eager_answer(exported, loaded, tmp_path):
    model, tokenizer = loaded
    sources = words(17, seed=10)
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n")
    hybrid(f"ckpt_path={exported}", "input=in.txt", "output=fast.txt", "max_new_tokens=12", "optimize=true",
           "progress=false", cwd=tmp_path)
    assert (tmp_path / "fast.txt").read_text().split("\n")[:-1] == [
        decode_alone(model, tokenizer, text, **GREEDY) for text in sources]
    hybrid(f"ckpt_path={exported}", "input=in.txt", "output=int8.txt", "max_new_tokens=12", "optimize=true",
           "quantize=int8", "progress=false", cwd=tmp_path)
    assert len((tmp_path / "int8.txt").read_text().split("\n")) == len(sources) + 1


def test_a_rerun_skips_finished_shards_and_writes_the_same_bytes(loaded, tmp_path, monkeypatch):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("\n".join(words(200, seed=3)) + "\n")
    job = BulkJob.for_model(model, SAMPLED, shard_size=30, seed=7)
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "whole.txt"), job, progress=False)

    saved, save = [], ShardStore.save

    def crash_on_the_third_shard(store, shard, lines, rejects=None):
        if len(saved) == 2:
            raise KeyboardInterrupt
        saved.append(shard.start)
        save(store, shard, lines, rejects)

    monkeypatch.setattr(ShardStore, "save", crash_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), job, progress=False)
    monkeypatch.setattr(ShardStore, "save", save)
    decoded = []

    def counting(*args, **kwargs):
        decoded.append(1)
        return decode_shard(*args, **kwargs)

    monkeypatch.setattr("hybrid.bulk.job.decode_shard", counting)
    assert run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), job, progress=False)
    assert len(decoded) == 7 - 2  # 200 inputs in shards of 30: 7 shards, 2 were done
    assert (tmp_path / "out.txt").read_bytes() == (tmp_path / "whole.txt").read_bytes()


def test_a_rerun_with_other_settings_is_refused(loaded, tmp_path):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("abc\nde\n")
    job = BulkJob.for_model(model, GREEDY, shard_size=1)
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), "-", job, work_dir=str(tmp_path / "work"),
             keep_shards=True, progress=False)
    other = BulkJob.for_model(model, {"max_new_tokens": 5}, shard_size=1)
    with pytest.raises(ValueError, match=r"other settings \(generation differ\)"):
        run_bulk(model, tokenizer, str(tmp_path / "in.txt"), "-", other, work_dir=str(tmp_path / "work"))


def test_a_rerun_after_the_input_or_the_model_changed_is_refused(loaded, tmp_path):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("abc\nde\n")
    job, work = BulkJob.for_model(model, GREEDY, shard_size=1), str(tmp_path / "work")
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), "-", job, work_dir=work, keep_shards=True, progress=False)
    (tmp_path / "in.txt").write_text("abd\nde\n")  # same path, same size, one byte edited
    with pytest.raises(ValueError, match=r"\(input_blake2b differ\).*resume=false"):
        run_bulk(model, tokenizer, str(tmp_path / "in.txt"), "-", job, work_dir=work, progress=False)
    (tmp_path / "in.txt").write_text("abc\nde\n")
    replaced = copy.deepcopy(model)
    with torch.no_grad():
        replaced.lm_head.weight[0, 0] += 1e-3
    with pytest.raises(ValueError, match=r"\(model_blake2b differ\)"):
        run_bulk(replaced, tokenizer, str(tmp_path / "in.txt"), "-", job, work_dir=work, progress=False)


def test_shard_splits_partition_the_input_and_the_last_job_merges(loaded, tmp_path):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("\n".join(words(100, seed=4)) + "\n")
    job = BulkJob.for_model(model, GREEDY, shard_size=15)
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "whole.txt"), job, progress=False)
    output, work = str(tmp_path / "out.txt"), tmp_path / "out.txt.parts"
    finished = [run_bulk(model, tokenizer, str(tmp_path / "in.txt"), output, job, shard=f"{i}/3", progress=False,
                         keep_shards=True) for i in (2, 0, 1)]
    assert finished == [False, False, True]
    ranges = [tuple(r) for path in work.glob("manifest-*.json") for r in json.loads(path.read_text())["done"]]
    assert sorted(ranges) == [(start, min(start + 15, 100)) for start in range(0, 100, 15)]  # disjoint, covering
    assert Path(output).read_bytes() == (tmp_path / "whole.txt").read_bytes()


def test_standard_input_to_standard_output_with_a_progress_summary(exported, loaded, tmp_path):
    model, tokenizer = loaded
    sources = words(30, seed=5)
    result = hybrid(f"ckpt_path={exported}", "max_new_tokens=12", "batch_size=4", cwd=tmp_path,
                    stdin="\n".join(sources) + "\n")
    assert result.stdout.split("\n")[:-1] == [decode_alone(model, tokenizer, text, **GREEDY) for text in sources]
    assert "sequences/s" in result.stderr and "tokens/s" in result.stderr


def test_a_run_killed_midway_resumes_to_identical_output(exported, loaded, tmp_path):
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("\n".join(words(6000, seed=6)) + "\n")
    job = BulkJob.for_model(model, GREEDY, shard_size=100)
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "whole.txt"), job, progress=False)
    args = [f"ckpt_path={exported}", "input=in.txt", "output=out.txt", "shard_size=100", "max_new_tokens=12",
            "progress=false"]
    process = subprocess.Popen([sys.executable, "-m", "hybrid.cli", "generate", *args], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ONE_THREAD)
    manifest = tmp_path / "out.txt.parts" / "manifest-0of1.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if manifest.exists() and json.loads(manifest.read_text())["done"]:
            break
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    done = json.loads(manifest.read_text())["done"]
    assert 1 <= len(done) < 60 and not (tmp_path / "out.txt").exists(), "the kill did not land mid-run"
    result = hybrid(*args, cwd=tmp_path)
    assert f"resuming: {len(done)} shard(s) already done" in result.stderr
    assert (tmp_path / "out.txt").read_bytes() == (tmp_path / "whole.txt").read_bytes()


def test_ddp_on_two_cpu_processes_matches_one_process(exported, loaded, tmp_path):
    """Lightning's predict with the DDP strategy (gloo on the CPU): each rank writes its own shards,
    rank 0 merges them in input order."""
    model, tokenizer = loaded
    (tmp_path / "in.txt").write_text("\n".join(words(300, seed=8)) + "\n")
    job = BulkJob.for_model(model, GREEDY, shard_size=40)
    run_bulk(model, tokenizer, str(tmp_path / "in.txt"), str(tmp_path / "whole.txt"), job, progress=False)
    hybrid(f"ckpt_path={exported}", "input=in.txt", "output=out.txt", "shard_size=40", "max_new_tokens=12",
           "strategy=ddp", "devices=2", "keep_shards=true", cwd=tmp_path, timeout=180)
    manifests = sorted(p.name for p in (tmp_path / "out.txt.parts").glob("manifest-*.json"))
    assert manifests == ["manifest-0of2.json", "manifest-1of2.json"]
    assert (tmp_path / "out.txt").read_bytes() == (tmp_path / "whole.txt").read_bytes()
