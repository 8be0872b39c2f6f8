"""A small, known workload for py-spy: main -> middle -> leaf, repeated ARGV[1] times."""
import sys


def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def middle(n):
    return leaf(n) + 1


def main():
    total = 0
    for _ in range(int(sys.argv[1])):
        total += middle(20000)
    print(total)


main()
