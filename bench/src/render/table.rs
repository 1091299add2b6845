//! The one Markdown table writer: every table of the results file (the PASS/FAIL summary and each
//! scenario's rows) goes through it, so a table is its columns and its rows, not pipes by hand.

use std::fmt::{Display, Write as _};

/// How a column lines up: text to the left, figures to the right (`---` and `---:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A column: its heading and how its cells line up.
#[derive(Clone, Copy, Debug)]
pub struct Column<'a> {
    pub heading: &'a str,
    pub align: Align,
}

/// A column of text (names, codes, lists).
pub const fn text(heading: &str) -> Column<'_> {
    Column { heading, align: Align::Left }
}

/// A column of figures.
pub const fn figure(heading: &str) -> Column<'_> {
    Column { heading, align: Align::Right }
}

/// A table being written into `out`: the heading and rule are written when it is made, then
/// each [`Table::row`] as it comes.
pub struct Table<'a> {
    out: &'a mut String,
}

impl<'a> Table<'a> {
    pub fn new(out: &'a mut String, columns: &[Column<'_>]) -> Self {
        let mut table = Self { out };
        table.line(columns.iter().map(|c| c.heading));
        table.line(columns.iter().map(|c| match c.align {
            Align::Left => "---",
            Align::Right => "---:",
        }));
        table
    }

    /// One row; each cell as it displays (an empty cell stays empty).
    pub fn row(&mut self, cells: &[&dyn Display]) -> &mut Self {
        self.line(cells.iter());
        self
    }

    fn line<T: Display>(&mut self, cells: impl Iterator<Item = T>) {
        self.out.push('|');
        for cell in cells {
            let start = self.out.len();
            let _ = write!(self.out, " {cell}");
            if self.out.len() == start + 1 {
                // An empty cell is `| |`, as it was written by hand.
                self.out.truncate(start);
            }
            self.out.push_str(" |");
        }
        self.out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_its_heading_its_rule_and_its_rows() {
        let mut out = String::new();
        Table::new(&mut out, &[text("setup"), figure("OK/s"), text("codes")])
            .row(&[&"direct", &format!("{:.1}", 12.34), &""])
            .row(&[&"multiplexer", &7, &"OK 7"]);
        assert_eq!(
            out,
            "| setup | OK/s | codes |\n| --- | ---: | --- |\n| direct | 12.3 | |\n| multiplexer | 7 | OK 7 |\n"
        );
    }
}
