# Cross-compiling for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu, against the
# multiarch :arm64 packages (oneTBB, spdlog, fmt, GoogleTest, Boost.Context) in
# /usr/lib/aarch64-linux-gnu; Eigen's headers are the host's (architecture-independent).
# Tests run under qemu user mode: `-L /` points qemu at the multiarch loader and libc
# (`-L /usr/aarch64-linux-gnu` would pair the cross toolchain's loader with the multiarch
# libc, which hangs in pthread_create). scripts/aarch64.sh drives it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
