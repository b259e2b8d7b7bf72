"""The one JSONL reader: plain and gzip files, line numbers in errors, a torn last line."""

import gzip

import pytest

from textzoo.errors import ConfigError, EnvError, TextzooError
from textzoo.jsonl import read_jsonl


def test_rows_keep_their_line_numbers_and_gzip_reads_alike(tmp_path):
    text = '{"a": 1}\n\n{"a": 2}\n'
    plain = tmp_path / "rows.jsonl"
    plain.write_text(text)
    packed = tmp_path / "rows.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write(text)
    assert read_jsonl(plain, "rows") == read_jsonl(packed, "rows") == [(1, {"a": 1}), (3, {"a": 2})]


def test_errors_name_the_file_and_line_in_the_callers_error_type(tmp_path):
    with pytest.raises(EnvError, match="dataset .*nope.jsonl' does not exist"):
        read_jsonl(tmp_path / "nope.jsonl", "dataset", EnvError)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match="line 2: must be a JSON object, got list"):
        read_jsonl(path, "pairs file", ConfigError)
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(TextzooError, match="line 2: not JSON"):
        read_jsonl(path, "log", torn_tail=True)  # only a *last* torn line is forgiven


def test_a_torn_last_line_is_dropped_when_asked(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    assert read_jsonl(path, "metrics file", torn_tail=True) == [(1, {"step": 1})]
    with pytest.raises(TextzooError, match="line 2: not JSON"):
        read_jsonl(path, "metrics file")
