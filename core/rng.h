// rng.h: splitmix64 (Steele, Lea and Flood, 2014), the one generator behind every seeded choice of
// the host code (weight init, data order, the validation split, attention test inputs, sampling):
// portable, full period over 2^64 states, and its whole state is one integer to checkpoint.
#ifndef RNG_H
#define RNG_H

#include <stdint.h>  // uint64_t

#define SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull

// The finalizer: a bijective mix of 64 bits (also a good hash of an integer).
static inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The next value of the generator whose state is *state.
static inline uint64_t splitmix64_next(uint64_t *state) { return splitmix64_mix(*state += SPLITMIX64_GAMMA); }

#endif  // RNG_H
