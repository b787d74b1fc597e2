//! Where log lines go: stderr, above the run's progress bars. tracing's formatter writes
//! each event into a fresh writer and drops it; the line is collected and written in one
//! piece through `rollflash_run::progress::suspend`, which clears the bars first and draws
//! them again after, so a log line never lands on top of a half-drawn bar.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;

/// The log writer factory: one [`Line`] per event.
#[derive(Debug, Clone, Copy)]
pub struct AboveBars;

/// One event's bytes, written above the bars when dropped.
#[derive(Debug, Default)]
pub struct Line(Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.0);
        rollflash_run::progress::suspend(|| {
            // Nowhere to report a failed write of a log line.
            let _ = std::io::stderr().lock().write_all(&bytes);
        });
    }
}

impl<'a> MakeWriter<'a> for AboveBars {
    type Writer = Line;

    fn make_writer(&'a self) -> Self::Writer {
        Line::default()
    }
}
