//! Least-squares fits of batch time against a batch's requests and tokens, weighted so that each
//! point's *relative* error counts the same: an 8-token batch of 4 ms and a 1,024-token one of
//! 200 ms are fitted equally well, not the large one alone.

use serde::Serialize;

/// One observed batch shape and its median device time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    pub requests: usize,
    pub tokens: usize,
    pub time_us: f64,
}

/// A fitted model: time = fixed + per_request × requests + per_token × tokens (microseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Fit {
    pub fixed_us: f64,
    pub per_request_us: f64,
    pub per_token_us: f64,
    /// Root mean square of (predicted − measured) / measured over the points.
    pub rms_relative_error: f64,
    /// The worst point's |predicted − measured| / measured.
    pub max_relative_error: f64,
    /// Root mean square of predicted − measured, microseconds.
    pub rms_error_us: f64,
}

impl Fit {
    pub fn predict(&self, requests: usize, tokens: usize) -> f64 {
        self.fixed_us + self.per_request_us * requests as f64 + self.per_token_us * tokens as f64
    }

    fn with_errors(fixed_us: f64, per_request_us: f64, per_token_us: f64, points: &[Point]) -> Self {
        let mut fit = Self { fixed_us, per_request_us, per_token_us, ..Self::default() };
        let n = points.len().max(1) as f64;
        let (mut rel2, mut abs2) = (0.0, 0.0);
        for p in points {
            let err = fit.predict(p.requests, p.tokens) - p.time_us;
            rel2 += (err / p.time_us).powi(2);
            abs2 += err * err;
            fit.max_relative_error = fit.max_relative_error.max((err / p.time_us).abs());
        }
        fit.rms_relative_error = (rel2 / n).sqrt();
        fit.rms_error_us = (abs2 / n).sqrt();
        fit
    }
}

/// fixed + per_token × tokens: the simulator's original model.
pub fn two_terms(points: &[Point]) -> Option<Fit> {
    let c = solve(points, &[Term::Fixed, Term::Tokens])?;
    Some(Fit::with_errors(c[0], 0.0, c[1], points))
}

/// fixed + per_request × requests + per_token × tokens. A coefficient the data make negative
/// (time cannot shrink with work) is dropped and the rest refitted.
pub fn three_terms(points: &[Point]) -> Option<Fit> {
    let c = solve(points, &[Term::Fixed, Term::Requests, Term::Tokens])?;
    if c.iter().all(|x| *x >= 0.0) {
        return Some(Fit::with_errors(c[0], c[1], c[2], points));
    }
    if c[1] < 0.0 {
        return two_terms(points);
    }
    let c = solve(points, &[Term::Requests, Term::Tokens])?;
    Some(Fit::with_errors(0.0, c[0].max(0.0), c[1].max(0.0), points))
}

#[derive(Clone, Copy)]
enum Term {
    Fixed,
    Requests,
    Tokens,
}

impl Term {
    fn of(self, p: &Point) -> f64 {
        match self {
            Self::Fixed => 1.0,
            Self::Requests => p.requests as f64,
            Self::Tokens => p.tokens as f64,
        }
    }
}

/// Weighted least squares through the normal equations (a handful of terms, well scaled by the
/// 1/time weights), solved by Gaussian elimination with partial pivoting. None when the points
/// cannot separate the terms (fewer points than terms, or collinear ones).
fn solve(points: &[Point], terms: &[Term]) -> Option<Vec<f64>> {
    let k = terms.len();
    if points.len() < k {
        return None;
    }
    // Row i of the system: [A | b] with A = Xᵀ W X and b = Xᵀ W y, W = 1/y².
    let mut m = vec![vec![0.0; k + 1]; k];
    for p in points {
        let w = 1.0 / (p.time_us * p.time_us);
        for (i, ti) in terms.iter().enumerate() {
            for (j, tj) in terms.iter().enumerate() {
                m[i][j] += w * ti.of(p) * tj.of(p);
            }
            m[i][k] += w * ti.of(p) * p.time_us;
        }
    }
    for col in 0..k {
        let pivot = (col..k).max_by(|a, b| m[*a][col].abs().total_cmp(&m[*b][col].abs()))?;
        m.swap(col, pivot);
        let scale = m[col][col];
        if scale.abs() < 1e-12 * m.iter().map(|r| r[col].abs()).fold(0.0, f64::max).max(1e-300) {
            return None;
        }
        let pivot_row = m[col].clone();
        for (row, r) in m.iter_mut().enumerate() {
            if row != col {
                let factor = r[col] / scale;
                for (x, p) in r.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= factor * p;
                }
            }
        }
    }
    Some((0..k).map(|i| m[i][k] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(f: impl Fn(usize, usize) -> f64) -> Vec<Point> {
        let mut out = Vec::new();
        for requests in 1..=4 {
            for per in [8, 32, 128, 256] {
                let tokens = requests * per;
                out.push(Point { requests, tokens, time_us: f(requests, tokens) });
            }
        }
        out
    }

    #[test]
    fn exact_data_give_back_their_coefficients() {
        let fit = three_terms(&points(|r, t| 2000.0 + 300.0 * r as f64 + 45.0 * t as f64)).unwrap();
        assert!((fit.fixed_us - 2000.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.per_request_us - 300.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.per_token_us - 45.0).abs() < 1e-8, "{fit:?}");
        assert!(fit.rms_relative_error < 1e-9 && fit.max_relative_error < 1e-9);
        let two = two_terms(&points(|_, t| 1000.0 + 20.0 * t as f64)).unwrap();
        assert!((two.fixed_us - 1000.0).abs() < 1e-6 && (two.per_token_us - 20.0).abs() < 1e-8, "{two:?}");
    }

    #[test]
    fn a_per_request_cost_shows_as_the_two_term_fits_error() {
        let data = points(|r, t| 1000.0 + 2000.0 * r as f64 + 10.0 * t as f64);
        let (two, three) = (two_terms(&data).unwrap(), three_terms(&data).unwrap());
        assert!(two.rms_relative_error > 0.1, "{two:?}");
        assert!(three.rms_relative_error < 1e-9, "{three:?}");
    }

    #[test]
    fn a_negative_per_request_term_is_dropped() {
        let data = points(|r, t| 1000.0 - 50.0 * r as f64 + 10.0 * t as f64);
        let fit = three_terms(&data).unwrap();
        assert_eq!(fit.per_request_us, 0.0);
        assert!(fit.fixed_us > 0.0 && fit.per_token_us > 0.0, "{fit:?}");
    }

    #[test]
    fn too_few_or_collinear_points_fit_nothing() {
        let one = [Point { requests: 1, tokens: 8, time_us: 100.0 }];
        assert!(three_terms(&one).is_none());
        // Tokens always 8 × requests: per request and per token cannot be told apart.
        let collinear: Vec<Point> =
            (1..=4).map(|r| Point { requests: r, tokens: 8 * r, time_us: 100.0 * r as f64 }).collect();
        assert!(solve(&collinear, &[Term::Fixed, Term::Requests, Term::Tokens]).is_none());
    }
}
