"""ROCStories readers and the ``(S, T + 1, N) = (S, 5, 16)`` windows of the paper (section 8.1).

Training stories come from the official training CSVs (``storyid, storytitle,
sentence1..sentence5``); validation stories from the Story Cloze CSVs (``InputStoryid,
InputSentence1..4, RandomFifthSentenceQuiz1, RandomFifthSentenceQuiz2, AnswerRightEnding``),
with the right ending as sentence 5.

    python -m world_model.data.rocstories DATA_DIR [--json OUT]
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import csv
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch

from world_model.text.vocab import PAD_ID, Vocabulary
from world_model.utils.cli import check_output
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import SettingsParser, add_verbose, settings_main

logger = logging.getLogger(__name__)

STORY_SENTENCES = 5
TRAIN_COLUMNS = ("storyid", "storytitle", *(f"sentence{i}" for i in range(1, 6)))
CLOZE_COLUMNS = (
    "InputStoryid",
    *(f"InputSentence{i}" for i in range(1, 5)),
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
)
TRAIN_PATTERN = "ROCStories*.csv"
CLOZE_PATTERN = "cloze_test_*.csv"
EXPECTED_FILES = (
    "training: ROCStories__spring2016 - ROCStories_spring2016.csv, "
    "ROCStories_winter2017 - ROCStories_winter2017.csv or ROCStories_subset_20000.csv; "
    "validation: cloze_test_val__spring2016 - cloze_test_ALL_val.csv and "
    "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
)


class DataError(ValueError):
    """A ROCStories file or folder is missing or malformed."""


@dataclass(frozen=True)
class Story:
    """One five-sentence story."""

    story_id: str
    sentences: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.sentences) != STORY_SENTENCES:
            raise ValueError(f"story {self.story_id} has {len(self.sentences)} sentences, expected {STORY_SENTENCES}")


@dataclass
class RocStoriesCorpus:
    """The training and validation stories of one data folder."""

    train: list[Story]
    validation: list[Story]

    def split(self, holdout: int = 0) -> tuple[list[Story], list[Story]]:
        """(training stories, validation stories): the cloze stories validate, or with `holdout` H > 0 the last H
        training stories do and the stories before them train (`training.holdout_stories`)."""
        if not holdout:
            return self.train, self.validation
        if not 0 < holdout < len(self.train):
            raise DataError(f"holding out {holdout} stories leaves none of the {len(self.train)} training stories")
        return self.train[:-holdout], self.train[-holdout:]


def _read_rows(path: str | os.PathLike, columns: Sequence[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """Yield ``(where, row)`` for each data row, ``where`` naming the file and row (header = row 1).

    Every value of ``columns`` is present and stripped; an empty one raises ``DataError``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames:
                raise DataError(f"{path}: file is empty")
            missing = [c for c in columns if c not in reader.fieldnames]
            if missing:
                raise DataError(f"{path}: missing column(s) {missing}; found {reader.fieldnames}")
            rows = 0
            for rows, row in enumerate(reader, start=1):
                where = f"{path}, row {rows + 1}"
                if None in row:
                    raise DataError(f"{where}: more fields than the {len(reader.fieldnames)} columns")
                values = {c: (row[c] or "").strip() for c in columns}
                empty = [c for c, v in values.items() if not v]
                if empty:
                    raise DataError(f"{where}: empty value in column(s) {empty}")
                yield where, values
            if rows == 0:
                raise DataError(f"{path}: file has a header but no stories")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 text (it holds byte {err.object[err.start]:#04x}, which UTF-8 cannot start with here: "
            "UTF-16 or binary?); save it as a UTF-8 CSV"
        ) from None
    except csv.Error as err:
        raise DataError(f"{path}: not a readable CSV ({err})") from None


def read_training_csv(path: str | os.PathLike) -> list[Story]:
    """Stories of an official training file (``storyid, storytitle, sentence1..sentence5``)."""
    return [
        Story(row["storyid"], tuple(row[f"sentence{i}"] for i in range(1, 6)))
        for _, row in _read_rows(path, TRAIN_COLUMNS)
    ]


@dataclass(frozen=True)
class ClozeStory:
    """One Story Cloze item: four context sentences, two candidate endings, the right one's index (0 or 1)."""

    story_id: str
    context: tuple[str, ...]
    endings: tuple[str, str]
    answer: int

    def story(self) -> Story:
        """The validation story: the context, then the right ending as sentence 5."""
        return Story(self.story_id, self.context + (self.endings[self.answer],))


def read_cloze_endings(path: str | os.PathLike) -> list[ClozeStory]:
    """Items of a Story Cloze file with both endings (``RandomFifthSentenceQuiz1/2``) and the right one
    (``AnswerRightEnding``, 1 or 2, stored as index 0 or 1)."""
    items = []
    for where, row in _read_rows(path, CLOZE_COLUMNS):
        answer = row["AnswerRightEnding"]
        if answer not in ("1", "2"):
            raise DataError(f"{where}: AnswerRightEnding is {answer!r}, expected 1 or 2")
        items.append(
            ClozeStory(
                row["InputStoryid"],
                tuple(row[f"InputSentence{i}"] for i in range(1, 5)),
                (row["RandomFifthSentenceQuiz1"], row["RandomFifthSentenceQuiz2"]),
                int(answer) - 1,
            )
        )
    return items


def read_cloze_csv(path: str | os.PathLike) -> list[Story]:
    """Stories of a Story Cloze file: sentences 1-4, then the ending named by
    ``AnswerRightEnding`` (1 or 2)."""
    return [item.story() for item in read_cloze_endings(path)]


def cloze_half(path: str | os.PathLike) -> str:
    """The half a Story Cloze file holds, from its official name: ``cloze_test_val__...`` -> ``"val"``,
    ``cloze_test_test__...`` -> ``"test"``; any other name -> the file's stem."""
    name = Path(path).name
    half = name[len("cloze_test_") :].split("__")[0] if name.startswith("cloze_test_") else ""
    return half if half in ("val", "test") else Path(path).stem


def load_cloze_halves(data_dir: str | os.PathLike) -> dict[str, list[ClozeStory]]:
    """``{half: items}`` of every ``cloze_test_*.csv`` of ``data_dir``, the val half first, then the test half."""
    halves: dict[str, list[ClozeStory]] = {}
    for path in find_split_files(data_dir, ("validation",))["validation"]:
        half = cloze_half(path)
        if half in halves:
            raise DataError(f"{data_dir}: two Story Cloze files hold the {half!r} half")
        halves[half] = read_cloze_endings(path)
    order = {"val": 0, "test": 1}
    return dict(sorted(halves.items(), key=lambda item: order.get(item[0], 2)))


def encode_cloze(
    items: Sequence[ClozeStory], vocab: Vocabulary, n: int = 16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Story Cloze items -> context ``(S, 4, n)``, endings ``(S, 2, n)`` and right-ending index ``(S,)``."""
    context = vocab.encode_batch([s for item in items for s in item.context], n).reshape(len(items), 4, n)
    endings = vocab.encode_batch([e for item in items for e in item.endings], n).reshape(len(items), 2, n)
    return context, endings, torch.tensor([item.answer for item in items], dtype=torch.long)


def find_split_files(
    data_dir: str | os.PathLike, splits: Sequence[str] = ("train", "validation")
) -> dict[str, list[Path]]:
    """Sorted ``{"train": ROCStories*.csv, "validation": cloze_test_*.csv}`` files of ``data_dir``
    (only the ``splits`` asked for; each must have at least one file)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such folder; expected it to hold {EXPECTED_FILES}")
    patterns = {"train": TRAIN_PATTERN, "validation": CLOZE_PATTERN}
    files = {split: sorted(data_dir.glob(patterns[split])) for split in splits}
    for split, found in files.items():
        if not found:
            raise DataError(f"{data_dir}: no {split} file found; expected {EXPECTED_FILES}")
    return files


def load_corpus(data_dir: str | os.PathLike) -> RocStoriesCorpus:
    """Read every training and validation file of ``data_dir``.

    A story id repeated across or within the training files is kept once (first occurrence),
    and the number dropped is logged as a warning.
    """
    files = find_split_files(data_dir)
    train: dict[str, Story] = {}
    duplicates = 0
    for path in files["train"]:
        for story in read_training_csv(path):
            if story.story_id in train:
                duplicates += 1
            else:
                train[story.story_id] = story
    if duplicates:
        logger.warning("dropped %d duplicate training story id(s) in %s", duplicates, data_dir)
    validation = [story for path in files["validation"] for story in read_cloze_csv(path)]
    return RocStoriesCorpus(train=list(train.values()), validation=validation)


def build_vocabulary(corpus: RocStoriesCorpus) -> Vocabulary:
    """Vocabulary over every sentence of the pool, training and validation (paper, section 8.1)."""
    return Vocabulary.build(s for story in corpus.train + corpus.validation for s in story.sentences)


def encode_windows(stories: Sequence[Story], vocab: Vocabulary, n: int = 16) -> torch.Tensor:
    """``LongTensor`` of shape ``(S, 5, n)``: one window of ``T + 1 = 5`` sentences per story."""
    sentences = [s for story in stories for s in story.sentences]
    return vocab.encode_batch(sentences, n).reshape(len(stories), STORY_SENTENCES, n)


def corpus_statistics(corpus: RocStoriesCorpus, vocab: Vocabulary, n: int = 16) -> dict:
    """The corpus figures of section 8.1, measured on ``corpus``.

    ``pad_fraction`` is padding ids over all ``S * 5 * n`` slots of the pool,
    ``truncated_sentences`` counts pool sentences of more than ``n`` tokens, and
    ``validation_last_sentence_tokens`` the non-padding ids of sentence 5 of the validation
    windows (the denominator of the S(4) cross-entropy).
    """
    pool = corpus.train + corpus.validation
    ids, stats = vocab.encode_with_stats([s for story in pool for s in story.sentences], n)
    windows = ids.reshape(len(pool), STORY_SENTENCES, n)
    validation_last = windows[len(corpus.train) :, -1]
    return {
        "vocab_size": len(vocab),
        "train_stories": len(corpus.train),
        "validation_stories": len(corpus.validation),
        "pad_fraction": float((windows == PAD_ID).double().mean()) if windows.numel() else 0.0,
        "truncated_sentences": stats["truncated"],
        "validation_last_sentence_tokens": int((validation_last != PAD_ID).sum()),
        "uniform_cross_entropy": math.log(len(vocab)),
    }


@dataclass
class StatisticsSettings:
    """The statistics command's flags (the data folder is its positional argument)."""

    json: Path | None = field(default=None, metadata={"help": "also write the statistics to this JSON file"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --json file"})


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        StatisticsSettings,
        "world_model.data.rocstories",
        "ROCStories corpus statistics (paper, section 8.1).",
        lambda settings, args, command: statistics_command(args.data_dir, settings.json, settings.overwrite),
        argv,
        arguments=add_data_dir,
    )


def add_data_dir(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the corpus folder and --verbose."""
    parser.add_argument("data_dir", type=Path, help="folder with ROCStories*.csv and cloze_test_*.csv")
    add_verbose(parser)


def statistics_command(data_dir: Path, json_path: Path | None, overwrite: bool = False) -> None:
    """The command's work: read the corpus, print its statistics (and write them to `json_path`, replacing a file
    there only with `overwrite`)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    if json_path:
        check_output(json_path, "--json", overwrite=overwrite)
    corpus = load_corpus(data_dir)
    stats = corpus_statistics(corpus, build_vocabulary(corpus))
    for key, value in stats.items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    if json_path:
        write_json_atomic(json_path, stats)


if __name__ == "__main__":
    sys.exit(main())
