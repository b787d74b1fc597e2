//! The kernels' small strided matrix products on `gemm` (the one `unsafe` of the kernels).

use super::Real;

/// A read-only strided matrix for [`matmul_into`]: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(super) struct MatRef<'a, T> {
    /// The elements, from `(0, 0)`.
    pub(super) data: &'a [T],
    /// Rows.
    pub(super) rows: usize,
    /// Columns.
    pub(super) cols: usize,
    /// Distance between rows.
    pub(super) rs: usize,
    /// Distance between columns.
    pub(super) cs: usize,
}

impl<T> MatRef<'_, T> {
    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`, where `dst` is row-major with
/// rows `dst_rs` apart: the `gemm` crate (candle's own CPU matmul engine) on the calling thread.
/// The attention kernel's products are small (a block of query rows against one head's keys)
/// and run inside rayon tasks already, so one more level of threads would only add overhead.
/// The one `unsafe` of the kernels, behind bounds checks: `gemm` takes raw pointers.
pub(super) fn matmul_into<T: Real>(
    dst: &mut [T],
    dst_rs: usize,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    accumulate: bool,
) -> candle_core::Result<()> {
    matmul_into_on(dst, dst_rs, lhs, rhs, accumulate, gemm::Parallelism::None)
}

/// [`matmul_into`] with gemm's own threading (`Parallelism::Rayon` splits the product over the
/// current rayon pool), for products large enough to share.
#[allow(unsafe_code)]
pub(super) fn matmul_into_on<T: Real>(
    dst: &mut [T],
    dst_rs: usize,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) -> candle_core::Result<()> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let dst_fits = m == 0 || n == 0 || (dst_rs >= n && (m - 1) * dst_rs + n <= dst.len());
    if rhs.rows != k || !lhs.fits() || !rhs.fits() || !dst_fits {
        candle_core::bail!(
            "attention: a {m}×{k} by {}×{n} product out of bounds",
            rhs.rows
        );
    }
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            for row in dst.chunks_mut(dst_rs.max(1)).take(m) {
                row[..n].fill(T::zero());
            }
        }
        return Ok(());
    }
    let stride = |s: usize| -> candle_core::Result<isize> {
        isize::try_from(s).map_err(|_| candle_core::Error::Msg("attention: stride overflow".into()))
    };
    let (dst_rs, lhs_rs, lhs_cs, rhs_rs, rhs_cs) = (
        stride(dst_rs)?,
        stride(lhs.rs)?,
        stride(lhs.cs)?,
        stride(rhs.rs)?,
        stride(rhs.cs)?,
    );
    // SAFETY: the checks above put every element gemm reads (`lhs (i, p)` for i < m, p < k;
    // `rhs (p, j)` for p < k, j < n) and writes (`dst[i * dst_rs + j]`, j < n ≤ dst_rs, so no
    // two coincide) inside its slice; `dst` is borrowed mutably, so it aliases neither input;
    // gemm returns only when the product is done (on this thread, or on the rayon pool it
    // joins), within the borrows; `T` is f32 or f64 ([`Real`]), types gemm implements.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs,
            accumulate,
            lhs.data.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.data.as_ptr(),
            rhs_cs,
            rhs_rs,
            T::unit(),
            T::unit(),
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}
