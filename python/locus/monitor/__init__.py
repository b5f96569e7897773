"""`locus monitor`: system counters over time (NUMAscope made general and safe).

engine.py samples the sensors (sensors/, one file each) and hands records to subscribers
and to a JSON-lines file (recordfile.py reads it back); fifo.py is the control FIFO;
stat.py and record.py are the `stat` and `record` commands; live.py serves the web UI.
"""
