"""softblk's bench report generator; bench/report/softblk_report.py is its
command line."""
