"""The one escaping of text output (tiering.cli.terminal)."""

from tiering.cli.terminal import echo, printable


def test_c26_printable_escapes_control_bidi_and_backslash():
    assert printable("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert printable("a\nb\x1b[31mc\u202ed\\e\x7f\x85\u2028\udcff") == (
        "a\\nb\\x1b[31mc\\u202ed\\\\e\\x7f\\x85\\u2028\\udcff"
    )
    assert printable("é ü 漢字") == "é ü 漢字"  # printable non-ASCII stays as it is
    assert printable(12) == "12"


def test_c26_echo_prints_one_line(capsys):
    echo("x\ny\r\tz")
    assert capsys.readouterr().out == "x\\ny\\r\\tz\n"
