"""The calculator tool: integers with + - * and parentheses, parsed by hand (never `eval`).

Grammar: expr := term (('+'|'-') term)*; term := factor ('*' factor)*;
factor := '-' factor | '(' expr ')' | digits. Anything else is a `CalculatorError`.
"""

from __future__ import annotations

MAX_LENGTH = 64


class CalculatorError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text.replace(" ", "")
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-") and self.peek():
            op = self.text[self.pos]
            self.pos += 1
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> int:
        value = self.factor()
        while self.take("*"):
            value *= self.factor()
        return value

    def factor(self) -> int:
        if self.take("-"):
            return -self.factor()
        if self.take("("):
            value = self.expr()
            if not self.take(")"):
                raise CalculatorError(f"{self.text!r}: missing ')' at {self.pos}")
            return value
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise CalculatorError(f"{self.text!r}: expected a number at {self.pos}")
        return int(self.text[start:self.pos])


def evaluate(expression: str) -> int:
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression of {len(expression)} characters, at most {MAX_LENGTH}")
    parser = _Parser(expression)
    value = parser.expr()
    if parser.pos != len(parser.text):
        raise CalculatorError(f"{parser.text!r}: unexpected {parser.peek()!r} at {parser.pos}")
    return value
