"""Polynomials in the graph's size symbols as dense coefficient vectors over a shared term basis.

Every cost (FLOPs, bytes, memory in use at a step) is a sum of a few monomials in the batch and
sequence symbols. Keeping them as rows of a matrix over one basis makes "evaluate at new sizes" one
matrix product: `.at` substitutes the few basis terms, never walks the graph again.
"""
from __future__ import annotations

import functools

import numpy as np
import sympy

from .shapes import Expr


@functools.lru_cache(maxsize=None)
def _terms(expr: Expr) -> tuple[tuple[Expr, float], ...]:
    return tuple((t, float(c)) for t, c in sympy.expand(expr).as_coefficients_dict().items())


class UnknownSizeError(ValueError):
    """A cost term's size symbol has no value at the sizes asked for."""

    def __init__(self, term: Expr, missing: set, subs: dict) -> None:
        names = ", ".join(sorted(map(str, missing)))
        known = ", ".join(f"{k}={v}" for k, v in sorted(subs.items(), key=lambda kv: str(kv[0]))) or "none"
        super().__init__(
            f"colauto cost model: size symbol(s) {names} (in the term {term}) have no value (known sizes: {known}); "
            "a size the graph's inputs do not determine (data-dependent, or created by a graph rewrite) "
            "cannot be costed")
        self.missing = missing


class Basis:
    """Index of monomials (sympy terms); `vector(expr)` gives expr's coefficients over it."""

    def __init__(self) -> None:
        self.terms: list[Expr] = []
        self._index: dict[Expr, int] = {}

    def sparse(self, expr: Expr) -> tuple[tuple[int, float], ...]:
        out = []
        for term, coeff in _terms(sympy.sympify(expr)):
            if term not in self._index:
                self._index[term] = len(self.terms)
                self.terms.append(term)
            out.append((self._index[term], coeff))
        return tuple(out)

    def dense(self, rows: list[tuple[tuple[int, float], ...]]) -> np.ndarray:
        """Stack sparse rows into an (n_rows, n_terms) matrix."""
        mat = np.zeros((len(rows), len(self.terms)))
        for i, row in enumerate(rows):
            for j, c in row:
                mat[i, j] += c
        return mat

    def values(self, subs: dict[sympy.Symbol, int]) -> np.ndarray:
        """The basis terms evaluated at concrete sizes. Every size symbol of every term needs a value: an
        unknown one (say an unbacked, data-dependent size) raises, naming it, instead of being dropped."""
        out = np.empty(len(self.terms))
        for i, t in enumerate(self.terms):
            if t.free_symbols:
                value = t.xreplace(subs)      # (a bare symbol becomes the int itself)
                if getattr(value, "free_symbols", None):
                    raise UnknownSizeError(t, value.free_symbols, subs)
                out[i] = float(value)
            else:
                out[i] = float(t)
        return out

    def expr(self, coeffs: np.ndarray) -> Expr:
        """The polynomial with these coefficients (integers where they are integral)."""
        total = sympy.Integer(0)
        for c, t in zip(coeffs, self.terms):
            if c:
                total += (sympy.Integer(int(c)) if float(c).is_integer() else sympy.Float(c)) * t
        return total
