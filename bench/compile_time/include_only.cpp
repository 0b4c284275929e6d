// pmap's headers and nothing else (scripts/compile_time.sh): their parse alone.
#include <pmap/pmap.hpp>

int main() { return 0; }
