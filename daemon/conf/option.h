/* conf/option.h — one way to read a number from the command line, shared
 * by ravnestd, every ravnestctl command and the benchmarks, so each mode
 * checks the same way: the whole argument, a number, within [min, max];
 * otherwise one line on stderr naming the option and what it takes, and the
 * caller exits with EX_USAGE.
 *
 *     long long v;
 *     if (option_int("epochs", optarg, 1, 1000000, &v) < 0)
 *             return EX_USAGE;  // "Invalid value for --epochs: 0 (an integer from 1 to 1000000)"
 *     o.epochs = (int)v;
 */
#pragma once

/* 0 and *ret set, or -EINVAL (not a whole integer) / -ERANGE (outside
 * [min, max]) after logging the message; *ret is untouched then. */
int option_int(const char *name, const char *value, long long min, long long max, long long *ret);
/* The same for a number in decimal notation, with an optional fraction and
 * exponent ("0.25", "1e-3"): no hex, inf or nan. */
int option_double(const char *name, const char *value, double min, double max, double *ret);
