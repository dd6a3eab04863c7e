"""Row filters (`--query EXPR`): a small closed language, parsed and evaluated here.

An expression is tokenized and parsed by the code below and evaluated into a boolean mask with
plain pandas comparisons; nothing in it is ever handed to eval, exec or pandas.eval (pandas'
`DataFrame.query` evaluates Python: `@name` reaches the caller's locals, and from there a shell).

Grammar (lowest precedence first; `not a == b` is `not (a == b)`, as in Python):

    expr        := and_expr ("or" and_expr)*
    and_expr    := not_expr ("and" not_expr)*
    not_expr    := "not" not_expr | comparison
    comparison  := operand [ compare_op operand | ["not"] "in" list ]
    compare_op  := "==" | "!=" | "<" | "<=" | ">" | ">="
    operand     := column | literal | "(" expr ")"
    list        := "[" [ literal ("," literal)* ] "]"
    column      := NAME | "`" any characters but ` \\ and newline "`"
    literal     := NUMBER | STRING | "True" | "False"

    NAME        := [A-Za-z_][A-Za-z0-9_]*, not starting with "__", not a Python keyword
    NUMBER      := an optional "-", digits with an optional "." and exponent (3, 0.5, 1e13, 6e+18)
    STRING      := '...' or "..." on one line, without backslashes

A column used as a condition on its own (`not outlier`) must hold booleans; a missing value
counts as false. Anything else (`@`, attribute access `a.b`, calls `f(x)`, subscripts `a[0]`,
arithmetic, `lambda`, `;`, backslashes, string prefixes such as f'...') is a DelphiError naming
the expression, the token and its position, as is a name that is not a column of the table.
"""

from __future__ import annotations

import keyword
import operator
import re
from typing import Any, NamedTuple

import pandas as pd

from delphi.errors import DelphiError, quoted

WORDS = ("and", "or", "not", "in", "True", "False")
# Parentheses and `not` nest; each level is a few Python frames while parsing and evaluating.
MAX_NESTING = 50
SUMMARY = "columns, numbers, 'strings', == != < <= > >=, and/or/not, in [...], ( )"
COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
HINTS = {
    "&": "use 'and'",
    "|": "use 'or'",
    "~": "use 'not'",
    "=": "use '=='",
    "!": "use '!=' or 'not'",
    "@": "variables cannot be referenced",
    ".": "attribute access is not allowed",
    "\\": "backslashes are not allowed, not even in strings",
    **{c: "arithmetic is not allowed" for c in "+-*/%"},
    "'": "unterminated string",
    '"': "unterminated string",
    "`": "unterminated or empty backtick name",
}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])
  | (?P<string>'[^'\\\n]*'|"[^"\\\n]*")
  | (?P<backtick>`[^`\\\n]+`)
  | (?P<op>==|!=|<=|>=|<|>)
  | (?P<punct>[()\[\],])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)(?![\w'"`])
""",
    re.VERBOSE | re.ASCII,
)


class Token(NamedTuple):
    kind: str  # number, string, column, op, punct, word, end
    text: str  # as written
    pos: int  # 0-based offset into the expression
    value: Any = None  # a literal's value, a column's name


def _is_literal(token: Token) -> bool:
    return token.kind in ("number", "string") or (token.kind == "word" and token.text in ("True", "False"))


def _where(expr: str, pos: int) -> str:
    return f"at character {pos + 1} of query {quoted(expr)}"


def tokenize(expr: str) -> list[Token]:
    """The expression's tokens, ending with an `end` token; a DelphiError at the first character
    that starts no token of the grammar."""
    tokens, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            bad = re.compile(r"\w+|\S").match(expr, pos).group()
            if bad in "'\"`":  # a quote not closed on its line, or a backslash before the close
                inside = re.compile(rf"[^{bad}\n]*").match(expr, pos + 1).group()
                if "\\" in inside:
                    pos, bad = pos + 1 + inside.index("\\"), "\\"
            follows = expr[pos + len(bad) : pos + len(bad) + 1]
            hint = HINTS.get(bad[0]) or (
                "string prefixes such as f'...' are not allowed"
                if follows and follows in "'\"`"
                else "numbers are decimal"
                if bad[0].isdigit()
                else None
            )
            hint = f" ({hint})" if hint else ""
            raise DelphiError(
                f"{quoted(bad)} {_where(expr, pos)} is not part of the query language{hint}; allowed: {SUMMARY}"
            )
        kind, text = m.lastgroup, m.group()
        if kind == "number":
            try:
                value = int(text) if re.fullmatch(r"-?\d+", text) else float(text)
            except ValueError:  # an int of more than 4300 digits
                raise DelphiError(f"number {quoted(text)} {_where(expr, pos)} is too long") from None
            tokens.append(Token("number", text, pos, value))
        elif kind == "string":
            tokens.append(Token("string", text, pos, text[1:-1]))
        elif kind == "backtick":
            tokens.append(Token("column", text, pos, text[1:-1]))
        elif kind == "name":
            if text in WORDS:
                tokens.append(Token("word", text, pos, {"True": True, "False": False}.get(text)))
            elif text.startswith("__") or keyword.iskeyword(text):
                what = "a name starting with '__'" if text.startswith("__") else "a Python keyword"
                raise DelphiError(
                    f"{quoted(text)} {_where(expr, pos)} is not part of the query language ({what}; "
                    f"a column so named goes in backticks); allowed: {SUMMARY}"
                )
            else:
                tokens.append(Token("column", text, pos, text))
        elif kind != "space":
            tokens.append(Token(kind, text, pos))
        pos = m.end()
    tokens.append(Token("end", "", len(expr)))
    return tokens


# Parse tree: ("or", [nodes]), ("and", [nodes]), ("not", node), ("cmp", op, left, right),
# ("in", negated, node, [values]), ("col", name, pos), ("lit", value, pos).
Node = tuple


class _Parser:
    """Recursive descent over the tokens, one method per grammar rule."""

    def __init__(self, expr: str, tokens: list[Token]):
        self.expr, self.tokens, self.i, self.depth = expr, tokens, 0, 0

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.i += 1
        return token

    def at(self, kind: str, text: str | None = None, offset: int = 0) -> bool:
        token = self.peek(offset)
        return token.kind == kind and (text is None or token.text == text)

    def fail(self, expected: str) -> DelphiError:
        token = self.peek()
        got = "the end" if token.kind == "end" else quoted(token.text)
        after = self.tokens[self.i - 1] if self.i > 0 else None
        hint = (
            " (calls and subscripts are not allowed)"
            if token.text in ("(", "[") and after is not None and (after.kind == "column" or after.text in ")]")
            else ""
        )
        return DelphiError(f"expected {expected}, got {got} {_where(self.expr, token.pos)}{hint}; allowed: {SUMMARY}")

    def expect(self, kind: str, text: str, expected: str) -> Token:
        if not self.at(kind, text):
            raise self.fail(expected)
        return self.take()

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise DelphiError(f"query {quoted(self.expr)} nests parentheses or 'not' more than {MAX_NESTING} deep")

    def parse(self) -> Node:
        node = self.expr_()
        if not self.at("end"):
            raise self.fail("'and', 'or' or the end of the query")
        return node

    def expr_(self) -> Node:
        items = [self.and_expr()]
        while self.at("word", "or"):
            self.take()
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else ("or", items)

    def and_expr(self) -> Node:
        items = [self.not_expr()]
        while self.at("word", "and"):
            self.take()
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else ("and", items)

    def not_expr(self) -> Node:
        if self.at("word", "not"):
            self.take()
            self.nest()
            node = ("not", self.not_expr())
            self.depth -= 1
            return node
        return self.comparison()

    def comparison(self) -> Node:
        left = self.operand()
        if self.at("op"):
            op = self.take().text
            return ("cmp", op, left, self.operand())
        if self.at("word", "in") or (self.at("word", "not") and self.at("word", "in", offset=1)):
            negated = self.take().text == "not"
            if negated:
                self.take()
            return ("in", negated, left, self.list_())
        return left

    def operand(self) -> Node:
        token = self.peek()
        if token.kind == "column":
            self.take()
            return ("col", token.value, token.pos)
        if _is_literal(token):
            self.take()
            return ("lit", token.value, token.pos)
        if self.at("punct", "("):
            self.take()
            self.nest()
            node = self.expr_()
            self.depth -= 1
            self.expect("punct", ")", "')'")
            return node
        raise self.fail("a column, a literal or '('")

    def list_(self) -> list[Any]:
        self.expect("punct", "[", "'[' after 'in'")
        values = []
        while not self.at("punct", "]"):
            if values:
                self.expect("punct", ",", "',' or ']'")
            if not _is_literal(self.peek()):
                raise self.fail("a literal (number, 'string', True or False) in the list")
            values.append(self.take().value)
        self.take()
        return values


def parse(expr: str) -> Node:
    """The parse tree of `expr` (see the module docstring); a DelphiError if it is not in the grammar."""
    if not isinstance(expr, str) or not expr.strip():
        raise DelphiError(f"query {quoted(expr)}: empty, expected a condition such as \"experiment == 'x'\"")
    return _Parser(expr, tokenize(expr)).parse()


def _columns(node: Node) -> list[tuple[str, int]]:
    """Every (column name, position) the tree reads, in order."""
    if node[0] == "col":
        return [(node[1], node[2])]
    if node[0] in ("or", "and"):
        return [c for item in node[1] for c in _columns(item)]
    if node[0] == "not":
        return _columns(node[1])
    if node[0] == "cmp":
        return _columns(node[2]) + _columns(node[3])
    if node[0] == "in":
        return _columns(node[2])
    return []


def _describe(node: Node) -> str:
    return f"column {quoted(node[1])}" if node[0] == "col" else quoted(node[1]) if node[0] == "lit" else "a condition"


def _mask(value: Any, node: Node, frame: pd.DataFrame, expr: str) -> pd.Series:
    """`value` (a node's result) as a boolean Series over `frame`; missing values are false."""
    if isinstance(value, bool):
        return pd.Series(value, index=frame.index, dtype=bool)
    if isinstance(value, pd.Series):
        if pd.api.types.is_bool_dtype(value.dtype) or pd.api.types.infer_dtype(value, skipna=True) == "boolean":
            return value.astype("boolean").fillna(False).astype(bool)
        raise DelphiError(
            f"query {quoted(expr)}: {_describe(node)} (dtype {value.dtype}) is not a condition "
            f"of true/false values; compare it, e.g. with =="
        )
    raise DelphiError(f"query {quoted(expr)}: {_describe(node)} is not a condition; compare it, e.g. with ==")


def _evaluate(node: Node, frame: pd.DataFrame, expr: str) -> Any:
    kind = node[0]
    if kind == "col":
        return frame[node[1]]
    if kind == "lit":
        return node[1]
    if kind in ("or", "and"):
        masks = [_mask(_evaluate(item, frame, expr), item, frame, expr) for item in node[1]]
        out = masks[0]
        for m in masks[1:]:
            out = (out | m) if kind == "or" else (out & m)
        return out
    if kind == "not":
        return ~_mask(_evaluate(node[1], frame, expr), node[1], frame, expr)
    if kind == "in":
        left = _evaluate(node[2], frame, expr)
        if isinstance(left, pd.Series):
            hit = left.isin(node[3])
            return ~hit if node[1] else hit
        return (left not in node[3]) if node[1] else (left in node[3])
    if kind == "cmp":
        op, left, right = node[1], _evaluate(node[2], frame, expr), _evaluate(node[3], frame, expr)
        try:
            result = COMPARE[op](left, right)
        except (TypeError, ValueError) as e:
            raise DelphiError(
                f"query {quoted(expr)}: cannot compare {_describe(node[2])} {op} {_describe(node[3])} "
                f"({type(e).__name__})"
            ) from None
        return bool(result) if not isinstance(result, pd.Series) else result
    raise AssertionError(f"unknown node {kind}")


def query_mask(frame: pd.DataFrame, expr: str) -> pd.Series:
    """The boolean mask over `frame`'s rows that `expr` selects. A DelphiError names an
    expression outside the grammar, its offending token and position, or a column the table
    lacks (with the columns it has)."""
    tree = parse(expr)
    view = frame.set_axis([str(c) for c in frame.columns], axis=1)  # labels as a query spells them
    for name, pos in _columns(tree):
        if name not in view.columns:
            have = ", ".join(quoted(str(c), 60) for c in frame.columns[:40])
            more = f" ... ({len(frame.columns)} in all)" if len(frame.columns) > 40 else ""
            raise DelphiError(f"unknown column {quoted(name)} {_where(expr, pos)}; the table has: {have}{more}")
        if list(view.columns).count(name) > 1:
            raise DelphiError(
                f"column {quoted(name)} {_where(expr, pos)} is not one column: the table has it more than once"
            )
    return _mask(_evaluate(tree, view, expr), tree, view, expr)


def select_rows(frame: pd.DataFrame, expr: str) -> pd.DataFrame:
    """The rows of `frame` that `expr` selects, index kept (what `frame.query(expr)` gave)."""
    return frame.loc[query_mask(frame, expr).to_numpy()]  # positional: a repeated index label is no trouble
