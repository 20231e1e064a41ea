"""Shell scripts and the commands they are made of, as bash splits them: checked against
the parser in tests/unit/test_safety.py and against bash itself in
tests/integration/test_safety_shell.py."""

PARSED = [
    ("ls -la", [("ls", "-la")]),
    ("ls && pwd || true; wc -l f | head", [("ls",), ("pwd",), ("true",), ("wc", "-l", "f"), ("head",)]),
    ("grep 'a b' \"c d\" e\\ f", [("grep", "a b", "c d", "e f")]),
    ('echo "x\\"y" "\\a" "\\\\" "a\\\nb"', [("echo", 'x"y', "\\a", "\\", "ab")]),
    ("echo a'b'\"c\"", [("echo", "abc")]),
    ("echo '' \"\"", [("echo", "", "")]),
    ("echo 'a;b' \"c|d\" e\\&f 'x\ny'", [("echo", "a;b", "c|d", "e&f", "x\ny")]),
    ("ls\n\npwd", [("ls",), ("pwd",)]),
    ("ls \\\n -la; echo x\\\ny", [("ls", "-la"), ("echo", "xy")]),
    ("echo '$(x)' '`y`' \\$HOME \\`z\\`", [("echo", "$(x)", "`y`", "$HOME", "`z`")]),
    ("echo ] = a=b -- %s ^x @y +z ,w :v", [("echo", "]", "=", "a=b", "--", "%s", "^x", "@y", "+z", ",w", ":v")]),
]
