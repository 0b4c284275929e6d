/// @file errors.hpp
/// @brief The exception types of pmap (SPEC section 5).
#pragma once

#include <stdexcept>
#include <string>

namespace pmap {

/// @brief Base of every validation error: raised before any kernel runs.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// @brief A value is out of range or inconsistent (JAX's ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// @brief An argument has the wrong kind (JAX's TypeError).
class TypeError : public Error {
 public:
  using Error::Error;
};

/// @brief A collective names an axis that no enclosing pmap binds.
class NameError : public Error {
 public:
  using Error::Error;
};

/// @brief A failure while devices run: outputs that disagree, collective misuse.
///
/// Exceptions thrown by the user's kernel are rethrown unchanged, not wrapped.
class DeviceError : public std::runtime_error {
 public:
  DeviceError(int device_id, const std::string& message)
      : std::runtime_error(message), device_id_(device_id) {}
  /// @brief Global id of the device that reported the failure.
  int device_id() const noexcept { return device_id_; }

 private:
  int device_id_;
};

}  // namespace pmap
