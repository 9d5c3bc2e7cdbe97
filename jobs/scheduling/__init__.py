"""Periodic jobs: the once-per-tick scheduler, the watchdog and the daily report."""
