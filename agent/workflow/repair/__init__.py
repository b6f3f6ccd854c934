"""After a failed verification: the failures mapped to the original's lines and to their changes (failures), the
bisection that finds the change behind differing tokens (bisection), and what the next round does (rounds)."""
