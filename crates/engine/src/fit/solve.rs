//! Least squares on error relative to each group's typical measurement, with every term kept at or above zero (a step cannot get
//! cheaper with more work).

use super::TERMS;
use super::rows::{Kind, Row};

const N: usize = TERMS.len();

/// θ minimising Σ ((x·θ − y) / typical y)² with θ ≥ 0; `fixed` terms stay at zero.
pub(crate) fn nonnegative_least_squares(rows: &[Row], fixed: [bool; N]) -> [f64; N] {
    // Each row divided by the median measurement of its group (a level's gaps, a prompt-length
    // bin's TTFTs), so that 2 ms gaps and 900 ms TTFTs weigh alike; not by its own measurement,
    // which lets a few short outliers (part of a stream written at once) pull the fit low. Each
    // kind weighs as much as the other in total: the few clean TTFTs of requests that were alone
    // are what tells the prefill terms from the overhead, and the many gaps would drown them.
    let count = |k| rows.iter().filter(|r| r.kind == k && r.y > 0.0).count().max(1) as f64;
    let (ttft, itl) = (count(Kind::Ttft), count(Kind::Itl));
    let typical = super::rows::group_medians(rows);
    let weighted: Vec<([f64; N], f64)> = rows
        .iter()
        .zip(&typical)
        .filter(|(r, _)| r.y > 0.0)
        .map(|(r, m)| {
            let w = match r.kind {
                Kind::Ttft => 1.0 / ttft.sqrt(),
                Kind::Itl => 1.0 / itl.sqrt(),
            } / m;
            (r.x.map(|v| v * w), w * r.y)
        })
        .collect();
    let mut allowed = [false; N];
    for (k, a) in allowed.iter_mut().enumerate() {
        *a = !fixed[k] && column_scale(&weighted, k) > 0.0;
    }
    // Six terms: every subset of them, solved without bounds, and the best whose terms are all
    // non-negative is the constrained optimum (the optimum is the free solution on its support).
    let mut best = ([0.0; N], f64::INFINITY);
    for mask in 0u32..1 << N {
        let free: [bool; N] = std::array::from_fn(|k| mask >> k & 1 == 1);
        if (0..N).any(|k| free[k] && !allowed[k]) {
            continue;
        }
        let theta = least_squares(&weighted, free);
        if theta.iter().any(|&t| t < 0.0) {
            continue;
        }
        let cost: f64 = weighted
            .iter()
            .map(|(x, y)| {
                let e = x.iter().zip(&theta).map(|(a, b)| a * b).sum::<f64>() - y;
                e * e
            })
            .sum();
        if cost < best.1 {
            best = (theta, cost);
        }
    }
    best.0
}

fn column_scale(rows: &[([f64; N], f64)], k: usize) -> f64 {
    let n = rows.len().max(1) as f64;
    (rows.iter().map(|(x, _)| x[k] * x[k]).sum::<f64>() / n).sqrt()
}

/// Ordinary least squares over the free columns, each scaled to unit size so that seconds per
/// pair and seconds per step share one matrix; the rest are zero.
fn least_squares(rows: &[([f64; N], f64)], free: [bool; N]) -> [f64; N] {
    let cols: Vec<usize> = (0..N).filter(|&k| free[k]).collect();
    let scale: Vec<f64> = cols.iter().map(|&k| column_scale(rows, k)).collect();
    let m = cols.len();
    let mut a = vec![vec![0.0; m + 1]; m];
    for (x, y) in rows {
        for (r, &kr) in cols.iter().enumerate() {
            let xr = x[kr] / scale[r];
            for (c, &kc) in cols.iter().enumerate() {
                a[r][c] += xr * x[kc] / scale[c];
            }
            a[r][m] += xr * y;
        }
    }
    // A whisper of ridge keeps columns that the run cannot tell apart from a singular matrix.
    for (r, row) in a.iter_mut().enumerate() {
        row[r] += 1e-9 * rows.len() as f64;
    }
    let solution = gauss(a);
    let mut theta = [0.0; N];
    for (r, &k) in cols.iter().enumerate() {
        theta[k] = solution[r] / scale[r];
    }
    theta
}

/// Gaussian elimination with partial pivoting on an augmented matrix.
fn gauss(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let m = a.len();
    for c in 0..m {
        let pivot = (c..m)
            .max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))
            .unwrap_or(c);
        a.swap(c, pivot);
        let p = a[c][c];
        if p.abs() < 1e-300 {
            continue;
        }
        let pivot_row = a[c].clone();
        for row in a.iter_mut().skip(c + 1) {
            let f = row[c] / p;
            for (v, q) in row.iter_mut().zip(&pivot_row).skip(c) {
                *v -= f * q;
            }
        }
    }
    let mut x = vec![0.0; m];
    for r in (0..m).rev() {
        let s: f64 = (r + 1..m).map(|k| a[r][k] * x[k]).sum();
        x[r] = if a[r][r].abs() < 1e-300 {
            0.0
        } else {
            (a[r][m] - s) / a[r][r]
        };
    }
    x
}
