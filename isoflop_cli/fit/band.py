"""How high, or how low, a run's curve can be at a later compute: profile bounds of a monotone curve.

The adaptive schedule asks of each run, from its eval points (x_i = log2 C_i, y_i) and its base
evaluation y_0 (at C = 0, the lower plateau), the largest value at x_t of any increasing curve

    f(x) = lower + (upper - lower) * s(k (x - m)),    0 <= lower <= upper <= 1,
                                                      f(m + 1/2) - f(m - 1/2) <= rise_max

in either of two shapes, both rising from 0 to 1 with slope k/4 at their midpoint m:

    sigmoid   s(z) = expit(z)
    ramp      s(z) = clip(z / 4 + 1/2, 0, 1)   (flat, then linear in log C, then flat)

whose squared error is within `slack` of the best fit's (and the smallest, for the frontier's lower
end); rise_max caps the gain over any doubling of compute (the one centred on the midpoint gains
most). With slack = (z sigma)^2 this is the profile-likelihood bound at z standard deviations: the
curves the points cannot tell from the best fit. The sigmoid is the model `fit` uses
(allocation.py), read the way a stopping rule needs: not "where is the curve" but "how far could it
still go". The ramp is there because RL curves often start late and then climb steadily in log C:
a sigmoid is symmetric about its midpoint, so through a sharp start it must bend over as sharply,
and it read such a climb as levelling off (scripts/bench_replay.py's `linear` grids; its misfit
also inflated the residual the schedule reads its noise from).

f is linear in (lower, upper) once (m, k) and the shape are fixed, so the bound is exact in those
two and searched on a grid over (m, k, shape): for every grid point, the region {SSE <= threshold}
is an ellipse in (lower, upper), the constraints a polygon, and the extreme of the linear functional
f(x_t) = (1 - s_t) lower + s_t upper over their intersection lies at the ellipse's tangent point or
where the ellipse meets an edge of the polygon. Every grid point at once, in numpy; each grid
point's 2x2 normal equations are written out by component (a 2-vector is a pair of arrays): one
adaptive replay of bench_replay's synthetic grid took 9.6 CPU-s so, 26.7 through einsum and batched
inverses, with bounds equal to 5e-14.
"""

from __future__ import annotations

import numpy as np
from scipy import special

MID_STEP = 0.05  # grid step of the midpoint m, in doublings of compute
SLOPES = (
    160  # grid points of the slope k, geometric from SLOPE_MIN to SLOPE_MAX (a bound within ~0.001 of a 4x finer grid)
)
SLOPE_MIN = 0.05  # per doubling: flatter than this over a sweep's range is a constant
SHAPES = ("sigmoid", "ramp")
SLOPE_MAX = 30.0  # per doubling (curves.SLOPE_MAX, 100 per decade): steeper is a step
# The triangle 0 <= lower <= upper <= 1 in (lower, upper), where the best fit lies: its edges
# lower = 0, upper = 1, lower = upper.
EDGES = (
    ((0.0, 0.0), (0.0, 1.0)),
    ((0.0, 1.0), (1.0, 0.0)),
    ((0.0, 0.0), (1.0, 1.0)),
)  # (start, direction): start + t * direction, t in [0, 1]


class CurveBand:
    """One run's points, prepared for bounds at any later compute: the grid over (m, k, shape) up to
    `x_max` (the sweep's largest budget, log2) and, per grid point, the normal equations in
    (lower, upper): SSE(lower, upper) = (lower, upper) H (lower, upper)' - 2 g . (lower, upper) + yy."""

    def __init__(
        self, x: np.ndarray, y: np.ndarray, base: float | None, x_max: float, shapes: tuple[str, ...] = SHAPES
    ):
        x, y = np.asarray(x, float), np.asarray(y, float)
        mids = np.arange(x.min() - 1.0, x_max + 1.0 + 1e-9, MID_STEP)
        slopes = np.geomspace(SLOPE_MIN, SLOPE_MAX, SLOPES)
        self.mid, self.slope, self.ramp = (
            a.ravel() for a in np.meshgrid(mids, slopes, np.asarray(shapes) == "ramp", indexing="ij")
        )
        s = self._shape(x[None, :], slice(None))  # (grid, points)
        if base is not None:  # the base evaluation sits on the lower plateau: s = 0
            s, y = np.concatenate([np.zeros((len(s), 1)), s], axis=1), np.concatenate([[base], y])
        a, b = 1.0 - s, s  # f = a * lower + b * upper at every point
        self.H = _Sym2((a * a).sum(1), (a * b).sum(1), (b * b).sum(1))  # each (grid,)
        self.g = (a @ y, b @ y)
        self.yy = float(y @ y)
        self.points = len(y)
        H = self.H
        det = H.xx * H.yy - H.xy**2
        self.regular = det > 1e-12 * np.maximum(H.xx * H.yy, 1e-300)
        safe = np.where(self.regular, det, 1.0)
        self.inverse = _Sym2(*(np.where(self.regular, v, 0.0) for v in (H.yy / safe, -H.xy / safe, H.xx / safe)))
        self.free = self.inverse.times(self.g)  # unconstrained least squares per grid point
        self.sse_by_grid = self._least_squares()
        self.best = int(np.argmin(self.sse_by_grid))

    def _shape(self, x, rows) -> np.ndarray:
        """s at the computes x (log2) for the grid points `rows`: (rows, len(x))."""
        return shape(self.slope[rows][:, None] * (np.atleast_2d(x) - self.mid[rows][:, None]), self.ramp[rows][:, None])

    @property
    def sse(self) -> float:
        """The best fit's squared error."""
        return max(float(self.sse_by_grid[self.best]), 0.0)  # an exact fit's normal equations may leave -1e-17

    def _least_squares(self) -> np.ndarray:
        """Per grid point, the least squared error with (lower, upper) in the triangle: the free
        solution's where it lies inside, else the best point's of the triangle's edges."""
        H, g = self.H, self.g
        inside = self.regular & _in_polygon(self.free)
        best = np.where(inside, _sse(self.free, H, g, self.yy), np.inf)
        for start, d in EDGES:
            curvature = H.form(d, d)
            slope = _dot(g, d) - H.form(start, d)
            t = np.clip(np.divide(slope, curvature, out=np.zeros_like(slope), where=curvature > 1e-12), 0.0, 1.0)
            best = np.minimum(best, _sse(_along(start, t, d), H, g, self.yy))
        return best

    def extreme(self, x: np.ndarray, slack: float, upper: bool = True, rise_max: float = np.inf) -> np.ndarray:
        """The largest (upper) or smallest value at each of the computes x (log2) of a curve whose
        squared error is at most the best fit's + slack, and which gains at most `rise_max` over any
        doubling of compute, (upper - lower) (2 expit(k / 2) - 1) for a sigmoid, (upper - lower)
        min(k / 4, 1) for a ramp, over the one centred on its midpoint (unless no such curve fits
        the points that well: a cap the points contradict is no bound)."""
        # The normal equations round at ~1e-16 of the data's scale: without that much room an exact
        # fit (or slack 0) could fail its own threshold and bound nothing.
        threshold = self.sse + slack + 1e-12 * max(self.yy, 1.0)
        keep = self.sse_by_grid <= threshold  # only these grid points have (lower, upper) within the threshold
        H, inverse = self.H.rows(keep), self.inverse.rows(keep)
        g, free, regular = (
            (self.g[0][keep], self.g[1][keep]),
            (self.free[0][keep], self.free[1][keep]),
            self.regular[keep],
        )
        k = self.slope[keep]
        gain = np.where(
            self.ramp[keep], np.minimum(k / 4, 1.0), 2 * special.expit(k / 2) - 1
        )  # over the doubling centred on m, per unit of upper - lower
        width = np.clip(rise_max / gain, 0.0, 1.0)  # upper - lower <= width at each grid point
        room = threshold - _sse(free, H, g, self.yy)
        # The polygon 0 <= lower <= upper <= 1, upper - lower <= width: its edges, start + t * direction, t in [0, 1].
        zero, one, w = np.zeros_like(width), np.ones_like(width), width
        edges = [
            ((zero, zero), (zero, w)),  # lower = 0
            ((zero, zero), (one, one)),  # lower = upper
            ((1 - w, one), (w, zero)),  # upper = 1
            ((zero, w), (1 - w, 1 - w)),
        ]  # upper = lower + width
        crossings = []  # where the ellipse {sse <= threshold} meets each edge, and the edges' ends within it
        for start, d in edges:  # sse(start + t d) = A t^2 - 2 B t + C
            A = H.form(d, d)
            B = _dot(g, d) - H.form(start, d)
            C = _sse(start, H, g, self.yy)
            root = np.sqrt(np.clip(B * B - A * (C - threshold), 0.0, None))
            safe = np.maximum(A, 1e-12)
            for t in ((B - root) / safe, (B + root) / safe, zero, one):
                p = _along(start, np.clip(t, 0.0, 1.0), d)
                crossings.append((p, _sse(p, H, g, self.yy) <= threshold * (1 + 1e-12) + 1e-15))
        sign = 1.0 if upper else -1.0
        out = []
        for x_t in np.atleast_1d(np.asarray(x, float)):
            s_t = self._shape(x_t, keep)[:, 0]
            c = (sign * (1.0 - s_t), sign * s_t)  # maximise c . (lower, upper)
            # The ellipse's tangent point in direction c: free + sqrt(room / c'H^-1c) H^-1 c.
            direction = inverse.times(c)
            reach = _dot(c, direction)
            with np.errstate(
                over="ignore", invalid="ignore"
            ):  # a singular grid point (reach 0) is not `regular`: masked here
                top = _along(free, np.sqrt(np.clip(room, 0.0, None) / np.maximum(reach, 1e-300)), direction)
                ok = regular & (room >= 0) & _in_polygon(top, width)
                best = np.where(ok, _dot(c, top), -np.inf)
            for p, feasible in crossings:  # or where it meets an edge of the polygon
                best = np.where(feasible, np.maximum(best, _dot(c, p)), best)
            out.append(sign * best.max())
        out = np.array(out)
        if not np.isfinite(out).all() and np.isfinite(rise_max):
            return self.extreme(x, slack, upper)  # the cap contradicts the points
        return out


class _Sym2:
    """A symmetric 2x2 matrix per grid point, [[xx, xy], [xy, yy]], each entry an array over the grid."""

    def __init__(self, xx: np.ndarray, xy: np.ndarray, yy: np.ndarray):
        self.xx, self.xy, self.yy = xx, xy, yy

    def rows(self, keep: np.ndarray) -> _Sym2:
        return _Sym2(self.xx[keep], self.xy[keep], self.yy[keep])

    def form(self, u, v) -> np.ndarray:
        """u' M v per grid point (u, v: pairs of arrays or of numbers)."""
        return u[0] * (self.xx * v[0] + self.xy * v[1]) + u[1] * (self.xy * v[0] + self.yy * v[1])

    def times(self, v) -> tuple[np.ndarray, np.ndarray]:
        return self.xx * v[0] + self.xy * v[1], self.xy * v[0] + self.yy * v[1]


def shape(z: np.ndarray, ramp: np.ndarray | bool) -> np.ndarray:
    """The rise from 0 to 1 at z = k (x - m): a ramp's or a sigmoid's."""
    return np.where(ramp, np.clip(z / 4 + 0.5, 0.0, 1.0), special.expit(z))


def _dot(u, v) -> np.ndarray:
    return u[0] * v[0] + u[1] * v[1]


def _along(start, t: np.ndarray, d) -> tuple[np.ndarray, np.ndarray]:
    """start + t d, per grid point."""
    return start[0] + t * d[0], start[1] + t * d[1]


def _sse(beta, H: _Sym2, g, yy: float) -> np.ndarray:
    """Squared error of (lower, upper) = beta at each grid point, from its normal equations."""
    return H.form(beta, beta) - 2 * _dot(beta, g) + yy


def _in_polygon(beta, width: np.ndarray | float = 1.0, eps: float = 1e-12) -> np.ndarray:
    lower, upper = beta
    return (lower >= -eps) & (upper <= 1 + eps) & (lower <= upper + eps) & (upper - lower <= width + eps)
