"""A user's own parallel corpus: finding its files, reading aligned pairs, refusing bad input, raw cleaning."""

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from tinyformer.translation.data import corpus
from tinyformer.translation.data.corpus import (
    CleaningReport,
    CorpusError,
    CorpusFiles,
    clean_pairs,
    count_lines,
    file_fingerprints,
    find_corpus,
    held_out,
    read_pairs,
)
from tinyformer.translation.data.tokenizer import file_sha256

EN = ["A man is riding a bike.", "  leading spaces and trailing  ", "Zwei\u00a0Leute, 'quoted' \u2013 dash"]
DE = ["Ein Mann fährt Fahrrad.", "Straße über Äpfel", "déjà vu\tmit Tab"]


def write(path, data, compress=False):
    """Write bytes (or text as UTF-8) to ``path``, gzip-compressed if asked; returns the path."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def lines_text(lines, ending="\n", final_newline=True):
    return ending.join(lines) + (ending if final_newline else "")


def refusal(call, *args, **kwargs):
    """The CorpusError ``call`` raises (reading a generator to its end), checked to be one line."""
    with pytest.raises(CorpusError) as info:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            list(result)
    message = str(info.value)
    assert "\n" not in message and message == message.strip()
    return message


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 bytes: every file spans many blocks, and lines are longer than one."""
    monkeypatch.setattr(corpus, "_BLOCK", 7)


# ---------------------------------------------------------------------------- finding the files
def test_a_prefix_finds_the_plain_files_of_both_languages(tmp_path):
    write(tmp_path / "train.en", lines_text(EN))
    write(tmp_path / "train.de", lines_text(DE))
    files = find_corpus(tmp_path / "train", "en", "de")
    assert files == CorpusFiles(tmp_path / "train.en", tmp_path / "train.de", "en", "de", "--train")
    assert files.paths == (tmp_path / "train.en", tmp_path / "train.de")
    assert files.describe() == f"{tmp_path}/train.{{en,de}}"
    assert not files.is_tsv


def test_a_prefix_finds_gzip_files_and_prefers_a_plain_one_beside_them(tmp_path):
    write(tmp_path / "train.en.gz", lines_text(EN), compress=True)
    write(tmp_path / "train.de.gz", lines_text(DE), compress=True)
    files = find_corpus(str(tmp_path / "train"), "en", "de", option="--valid")
    assert files.paths == (tmp_path / "train.en.gz", tmp_path / "train.de.gz")
    assert files.option == "--valid"
    assert files.describe() == f"{tmp_path}/train.{{en,de}}.gz"

    write(tmp_path / "train.en", lines_text(EN))
    assert find_corpus(tmp_path / "train", "en", "de").source == tmp_path / "train.en"


def test_one_side_plain_and_the_other_gzip_is_a_corpus_described_by_both_names(tmp_path):
    write(tmp_path / "train.en", lines_text(EN))
    write(tmp_path / "train.de.gz", lines_text(DE), compress=True)
    files = find_corpus(tmp_path / "train", "en", "de")
    assert files.paths == (tmp_path / "train.en", tmp_path / "train.de.gz")
    assert files.describe() == f"{tmp_path}/train.en + {tmp_path}/train.de.gz"
    assert list(read_pairs(files)) == list(zip(EN, DE))


def test_language_codes_with_a_variant_are_accepted(tmp_path):
    write(tmp_path / "train.pt_BR", lines_text(EN))
    write(tmp_path / "train.zh-Hans", lines_text(DE))
    files = find_corpus(tmp_path / "train", "pt_BR", "zh-Hans")
    assert files.describe() == f"{tmp_path}/train.{{pt_BR,zh-Hans}}"


def test_a_prefix_that_is_a_file_without_a_pair_beside_it_is_a_tsv_corpus(tmp_path):
    path = write(tmp_path / "corpus.tsv", "".join(f"{e}\t{d}\n" for e, d in zip(EN, DE[:2])))
    files = find_corpus(path, "en", "de")
    assert files == CorpusFiles(path, None, "en", "de", "--train")
    assert files.is_tsv and files.paths == (path,)
    assert files.describe() == str(path)


def test_a_missing_corpus_names_the_option_and_every_path_tried(tmp_path):
    prefix = tmp_path / "train"
    message = refusal(find_corpus, prefix, "en", "de", option="--valid")
    assert message.startswith("--valid: ")
    for tried in ("train.en", "train.en.gz", "train.de", "train.de.gz"):
        assert f"{tmp_path}/{tried}" in message


def test_a_missing_side_names_both_of_its_candidate_paths_and_the_side_found(tmp_path):
    write(tmp_path / "train.en.gz", lines_text(EN), compress=True)
    message = refusal(find_corpus, tmp_path / "train", "en", "de")
    assert message.startswith(f"--train: no {tmp_path}/train.de or {tmp_path}/train.de.gz")
    assert f"found {tmp_path}/train.en.gz" in message


def test_the_same_language_twice_is_refused(tmp_path):
    write(tmp_path / "train.en", lines_text(EN))
    assert refusal(find_corpus, tmp_path / "train", "en", "en").startswith("--src and --tgt are both 'en'")


@pytest.mark.parametrize("flag, src, tgt", [("--src", "EN", "de"), ("--tgt", "en", "d"), ("--src", "engl", "de"),
                                             ("--tgt", "en", "de-"), ("--src", "en\n", "de"),
                                             ("--src", "../en", "de"), ("--tgt", "en", None)])
def test_a_malformed_language_code_is_refused_and_named(tmp_path, flag, src, tgt):
    bad = src if flag == "--src" else tgt
    message = refusal(find_corpus, tmp_path / "train", src, tgt)
    assert message.startswith(f"{flag} {bad!r} is not a language code")


def test_a_directory_as_prefix_is_refused_with_a_hint(tmp_path):
    message = refusal(find_corpus, tmp_path, "en", "de", option="--test")
    assert message.startswith(f"--test: {tmp_path} is a directory")
    assert "prefix" in message


def test_a_directory_where_a_side_file_should_be_is_refused(tmp_path):
    (tmp_path / "train.en").mkdir()
    write(tmp_path / "train.de", lines_text(DE))
    assert refusal(find_corpus, tmp_path / "train", "en", "de") == \
        f"--train: {tmp_path}/train.en is a directory, not a corpus file"


# ---------------------------------------------------------------------------- reading pairs
@pytest.mark.parametrize("compress", [False, True])
def test_pairs_are_the_lines_unchanged_including_a_last_line_without_a_newline(tmp_path, compress):
    write(tmp_path / "c.en", lines_text(EN, final_newline=False), compress)
    write(tmp_path / "c.de", lines_text(DE), compress)
    pairs = read_pairs(find_corpus(tmp_path / "c", "en", "de"))
    assert list(pairs) == list(zip(EN, DE))


def test_pairs_are_read_lazily(tmp_path):
    write(tmp_path / "c.en", "one\n" + "x\n" * 10)
    write(tmp_path / "c.de", "eins\n")
    pairs = read_pairs(find_corpus(tmp_path / "c", "en", "de"))
    assert next(pairs) == ("one", "eins")
    pairs.close()


def test_crlf_endings_are_removed_and_nothing_else(tmp_path, small_blocks):
    source = ["a\r", " b ", "c\rd", "", "\te\r"]                # a lone \r, even at the end, is no line ending
    write(tmp_path / "c.en", "a\r\r\n b \r\nc\rd\r\n\r\n\te\r")
    write(tmp_path / "c.de", lines_text(["1", "2", "3", "4", "5"], ending="\r\n"))
    assert list(read_pairs(find_corpus(tmp_path / "c", "en", "de"))) == list(zip(source, "12345"))


def test_only_newline_splits_lines_not_form_feeds_or_unicode_separators(tmp_path):
    odd = ["a\x0cb", "c\u2028d", "e\x1cf\x85g", "h\vi"]
    write(tmp_path / "c.en", lines_text(odd))
    write(tmp_path / "c.de", lines_text(["1", "2", "3", "4"]))
    assert [s for s, _ in read_pairs(find_corpus(tmp_path / "c", "en", "de"))] == odd


def test_lines_longer_than_a_block_and_many_blocks_read_the_same(tmp_path, small_blocks):
    source = ["x" * 50, "short", "", "y" * 23 + "ü" * 9, "tail without newline " * 3]
    target = [str(i) for i in range(len(source))]
    write(tmp_path / "c.en", lines_text(source, final_newline=False))
    write(tmp_path / "c.de.gz", lines_text(target), compress=True)
    assert list(read_pairs(find_corpus(tmp_path / "c", "en", "de"))) == list(zip(source, target))


def test_empty_files_are_an_empty_corpus(tmp_path):
    write(tmp_path / "c.en", "")
    write(tmp_path / "c.de.gz", "", compress=True)
    files = find_corpus(tmp_path / "c", "en", "de")
    assert list(read_pairs(files)) == []
    assert count_lines(files.source) == count_lines(files.target) == 0


def test_a_tsv_corpus_reads_as_pairs_with_crlf_removed(tmp_path):
    path = write(tmp_path / "corpus.tsv", "a b\t c\r\n\tonly target\nsource only\t")
    assert list(read_pairs(find_corpus(path, "en", "de"))) == [("a b", " c"), ("", "only target"),
                                                                ("source only", "")]


def test_gzip_is_recognised_by_its_magic_bytes_not_its_name(tmp_path):
    path = write(tmp_path / "corpus.tsv", "hello\thallo\nbye\ttschüss\n", compress=True)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert list(read_pairs(find_corpus(path, "en", "de"))) == [("hello", "hallo"), ("bye", "tschüss")]

    write(tmp_path / "fake.en.gz", lines_text(EN))
    write(tmp_path / "fake.de.gz", lines_text(DE))
    assert list(read_pairs(find_corpus(tmp_path / "fake", "en", "de"))) == list(zip(EN, DE))


def test_a_concatenation_of_gzip_files_reads_as_one_file(tmp_path):
    write(tmp_path / "c.en.gz", gzip.compress(b"one\n") + gzip.compress(b"two\n"))
    write(tmp_path / "c.de", "eins\nzwei\n")
    assert list(read_pairs(find_corpus(tmp_path / "c", "en", "de"))) == [("one", "eins"), ("two", "zwei")]


@pytest.mark.parametrize("compress", [False, True])
def test_count_lines_counts_a_last_line_without_a_newline(tmp_path, compress, small_blocks):
    assert count_lines(write(tmp_path / "a", "one\ntwo\n\nfour", compress)) == 4
    assert count_lines(write(tmp_path / "b", "one\ntwo\n\n", compress)) == 3


# ---------------------------------------------------------------------------- refusals while reading
@pytest.mark.parametrize("longer", ["source", "target"])
@pytest.mark.parametrize("compress", [False, True])
def test_files_of_different_lengths_name_both_files_and_both_counts(tmp_path, longer, compress, small_blocks):
    counts = {"source": 5, "target": 3} if longer == "source" else {"source": 3, "target": 7}
    write(tmp_path / "c.en", "".join(f"en {i}\n" for i in range(counts["source"])), compress)
    write(tmp_path / "c.de", "".join(f"de {i}\n" for i in range(counts["target"])), compress)
    files = find_corpus(tmp_path / "c", "en", "de", option="--valid")
    pairs = read_pairs(files)
    assert [next(pairs) for _ in range(3)] == [(f"en {i}", f"de {i}") for i in range(3)]
    message = refusal(lambda: pairs)
    assert message.startswith("--valid: ")
    assert f"{tmp_path}/c.en has {counts['source']} lines" in message
    assert f"{tmp_path}/c.de has {counts['target']}" in message


def test_a_missing_last_newline_does_not_make_files_of_equal_length_differ(tmp_path):
    write(tmp_path / "c.en", "a\nb")
    write(tmp_path / "c.de", "1\n2\n")
    assert len(list(read_pairs(find_corpus(tmp_path / "c", "en", "de")))) == 2


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_the_file_and_its_line(tmp_path, compress):
    write(tmp_path / "c.en", lines_text(EN), compress)
    target = write(tmp_path / "c.de", "eins\nzwei\ndr\xffei\nvier\n".encode("latin-1"), compress)
    message = refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))
    assert message.startswith(f"--train: {target} line 3 is not UTF-8")
    assert "byte 3" in message


def test_invalid_utf8_far_into_a_file_names_the_right_line(tmp_path, small_blocks):
    write(tmp_path / "c.en", "".join(f"line {i} üü\n" for i in range(40)).encode() + b"bad \xc3(\n")
    write(tmp_path / "c.de", "".join(f"{i}\n" for i in range(41)))
    message = refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))
    assert f"{tmp_path}/c.en line 41 is not UTF-8 text (byte 5:" in message


def test_a_utf8_character_cut_by_the_end_of_the_file_is_refused(tmp_path):
    write(tmp_path / "c.en", "ok\n".encode() + "ü".encode()[:1])
    write(tmp_path / "c.de", "1\n2\n")
    assert f"{tmp_path}/c.en line 2 is not UTF-8" in refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))


@pytest.mark.parametrize("line, found", [("no tab here", "no tab"), ("a\tb\tc", "2 tabs"), ("\t\t\t", "3 tabs")])
def test_a_tsv_line_without_exactly_one_tab_names_the_file_the_line_and_the_tabs(tmp_path, line, found):
    path = write(tmp_path / "corpus.tsv", f"a\tb\nc\td\n{line}\ne\tf\n")
    message = refusal(read_pairs, find_corpus(path, "en", "de", option="--test"))
    assert message.startswith(f"--test: {path} line 3 has {found};")


def test_a_tsv_file_with_invalid_utf8_names_the_line(tmp_path):
    path = write(tmp_path / "corpus.tsv.gz", b"a\tb\n\xe9t\xe9\tsummer\n", compress=True)
    assert refusal(read_pairs, find_corpus(path, "en", "de")).startswith(f"--train: {path} line 2 is not UTF-8")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions")
def test_an_unreadable_file_is_a_one_line_refusal_naming_it(tmp_path):
    write(tmp_path / "c.en", lines_text(EN))
    target = write(tmp_path / "c.de", lines_text(DE))
    target.chmod(0)
    message = refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))
    assert message == f"--train: cannot read {target}: Permission denied"


def test_a_file_refused_by_the_system_is_a_one_line_refusal_naming_it(tmp_path, monkeypatch):
    write(tmp_path / "c.en", lines_text(EN))
    target = write(tmp_path / "c.de", lines_text(DE))

    def open_refusing_the_target(path, *args, **kwargs):
        if Path(path) == target:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(corpus, "open", open_refusing_the_target, raising=False)
    message = refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))
    assert message == f"--train: cannot read {target}: Permission denied"


def test_a_directory_given_as_a_corpus_file_is_a_one_line_refusal_naming_it(tmp_path):
    write(tmp_path / "c.en", lines_text(EN))
    (tmp_path / "dir.de").mkdir()
    files = CorpusFiles(tmp_path / "c.en", tmp_path / "dir.de", "en", "de", "--valid")
    assert refusal(read_pairs, files) == f"--valid: cannot read {tmp_path}/dir.de: Is a directory"
    assert refusal(count_lines, tmp_path / "dir.de", "--valid") == \
        f"--valid: cannot read {tmp_path}/dir.de: Is a directory"


def test_a_file_gone_after_it_was_found_is_a_one_line_refusal_naming_it(tmp_path):
    write(tmp_path / "c.en", lines_text(EN))
    target = write(tmp_path / "c.de", lines_text(DE))
    files = find_corpus(tmp_path / "c", "en", "de")
    target.unlink()
    assert refusal(read_pairs, files) == f"--train: cannot read {target}: No such file or directory"
    assert refusal(file_fingerprints, files) == f"--train: cannot read {target}: No such file or directory"


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "bad header"])
def test_a_damaged_gzip_file_is_a_one_line_refusal_naming_it(tmp_path, damage):
    data = gzip.compress("".join(f"sentence number {i}\n" for i in range(2000)).encode())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "corrupt":
        data = data[:20] + bytes(b ^ 0x5A for b in data[20:60]) + data[60:]
    else:
        data = data[:2] + b"\x00" + data[3:]
    write(tmp_path / "c.en", "x\n" * 2000)
    target = write(tmp_path / "c.de.gz", data)
    message = refusal(read_pairs, find_corpus(tmp_path / "c", "en", "de"))
    assert message.startswith(f"--train: cannot read {target}: ")
    if damage == "truncated":
        assert "truncated" in message
    assert refusal(count_lines, target).startswith(f"--train: cannot read {target}: ")


def test_a_path_with_a_newline_is_quoted_to_keep_the_message_on_one_line(tmp_path):
    prefix = tmp_path / "new\nline"
    message = refusal(find_corpus, prefix, "en", "de")
    assert repr(f"{prefix}.en") in message


# ---------------------------------------------------------------------------- cleaning
def test_pairs_with_an_empty_or_whitespace_only_side_are_dropped_and_counted():
    pairs = [("a", "b"), ("", "b"), ("a", ""), (" \t", "b"), ("a", "\u00a0\u3000"), ("", ""), ("c", "d")]
    report = CleaningReport()
    assert list(clean_pairs(iter(pairs), report)) == [("a", "b"), ("c", "d")]
    assert (report.read, report.empty, report.duplicate, report.kept) == (7, 5, 0, 2)
    assert report.describe() == "read 7 pairs: kept 2; dropped 5 empty"


def test_kept_pairs_are_passed_on_unchanged():
    pairs = [("  leading", "trailing  "), ("in  side", "\ttab"), ("x\u00a0", "y")]
    report = CleaningReport()
    assert list(clean_pairs(pairs, report, dedup=True)) == pairs
    assert report.describe() == "read 3 pairs: kept 3"


def test_dedup_drops_repeats_of_earlier_pairs_keeping_the_first_ones_in_order():
    pairs = [("a", "1"), ("b", "2"), ("a", "1"), ("a", "2"), ("b", "2"), ("a ", "1"), ("", "1"), ("", "1"),
             ("a", "1"), ("c", "3")]
    report = CleaningReport()
    kept = list(clean_pairs(pairs, report, dedup=True))
    assert kept == [("a", "1"), ("b", "2"), ("a", "2"), ("a ", "1"), ("c", "3")]
    assert (report.read, report.empty, report.duplicate, report.kept) == (10, 2, 3, 5)
    assert report.describe() == "read 10 pairs: kept 5; dropped 2 empty, 3 duplicates"

    report = CleaningReport()
    assert len(list(clean_pairs(pairs, report))) == 8
    assert report.duplicate == 0


def test_dedup_tells_apart_pairs_that_differ_only_in_where_a_tab_falls():
    pairs = [("a\tb", "c"), ("a", "b\tc")]
    assert list(clean_pairs(pairs, CleaningReport(), dedup=True)) == pairs


def test_a_report_describes_large_counts_with_separators_and_singulars_without_s():
    report = CleaningReport(read=4_500_000, empty=12, duplicate=28_986)
    assert report.kept == 4_471_002
    assert report.describe() == "read 4,500,000 pairs: kept 4,471,002; dropped 12 empty, 28,986 duplicates"
    assert CleaningReport(read=2, duplicate=1).describe() == "read 2 pairs: kept 1; dropped 1 duplicate"
    assert CleaningReport(read=1).describe() == "read 1 pair: kept 1"
    assert CleaningReport().describe() == "read 0 pairs: kept 0"


def test_cleaning_a_read_corpus_streams_through_both(tmp_path):
    write(tmp_path / "c.en", "a\n\nb\na\n")
    write(tmp_path / "c.de", "1\n2\n3\n1\n")
    report = CleaningReport()
    kept = list(clean_pairs(read_pairs(find_corpus(tmp_path / "c", "en", "de")), report, dedup=True))
    assert kept == [("a", "1"), ("b", "3")]
    assert report.describe() == "read 4 pairs: kept 2; dropped 1 empty, 1 duplicate"


# ---------------------------------------------------------------------------- held-out pairs and fingerprints
def test_held_out_indices_are_sorted_unique_in_range_and_fixed_by_the_seed():
    indices = held_out(10_000, 300, seed=7)
    assert indices.dtype == np.int64 and indices.shape == (300,)
    assert np.all(np.diff(indices) > 0)
    assert indices[0] >= 0 and indices[-1] < 10_000
    assert np.array_equal(indices, held_out(10_000, 300, seed=7))
    assert not np.array_equal(indices, held_out(10_000, 300, seed=8))


def test_held_out_may_take_all_pairs_but_one():
    assert held_out(5, 4, seed=0).tolist() in ([0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 3, 4], [0, 2, 3, 4], [1, 2, 3, 4])
    assert held_out(5, 0, seed=0).tolist() == []


@pytest.mark.parametrize("count, size", [(100, 100), (100, 1000), (0, 1)])
def test_held_out_refuses_a_training_corpus_too_small_to_hold_out_the_pairs(count, size):
    message = refusal(held_out, count, size, seed=0)
    assert message.startswith(f"--train: the training corpus is too small to hold out {size:,} pairs")


def test_held_out_refuses_arguments_that_are_no_counts():
    with pytest.raises(ValueError, match="size must be"):
        held_out(10, -1, seed=0)
    with pytest.raises(ValueError, match="seed must be"):
        held_out(10, 2, seed=1.5)


def test_fingerprints_are_the_sha256_of_each_file(tmp_path):
    source = write(tmp_path / "c.en", lines_text(EN))
    target = write(tmp_path / "c.de.gz", lines_text(DE), compress=True)
    files = find_corpus(tmp_path / "c", "en", "de")
    assert file_fingerprints(files) == {str(source): file_sha256(source), str(target): file_sha256(target)}
    tsv = write(tmp_path / "t.tsv", "a\tb\n")
    assert file_fingerprints(find_corpus(tsv, "en", "de")) == {str(tsv): file_sha256(tsv)}


def test_corpus_files_accepts_strings_as_paths():
    files = CorpusFiles("a.en", "a.de", "en", "de")
    assert files.paths == (Path("a.en"), Path("a.de")) and files.option == "--train"
