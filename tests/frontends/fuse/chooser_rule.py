"""What a level_chooser's choice in `softblk list --json` must satisfy.

The level kept is within the margin (5%) of the best rate by the mean of
the sweep's two passes, or by one pass alone (a costlier level must win
both passes, so a pass that found a cheaper one close enough decides), or
it is the level in use, kept while within 5% of the mean's best. The
figures shown are rounded to whole requests per second: one of slack.
"""


def within_5_percent_somewhere(choice):
    level = str(choice["level"])
    for rates in [choice["rates_per_s"], *choice["rates_per_s_by_pass"]]:
        if rates[level] * 1.05 + 1 >= max(rates.values()):
            return True
    return False
