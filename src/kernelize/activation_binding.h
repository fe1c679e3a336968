// Internal: binding hub kernels to the activation layers (SiLU, GeLU, GeluTanh, NewGELU, FastGELU,
// QuickGELU — the names Transformers registers, see src/nn/activation.cc) through the activation@1
// interface (and silu@1 for SiLU), with the gated product (an MLP's act(gate)·up) through the same
// library's act_and_mul@1 entry when it has one. Adapters.cc dispatches activation layers here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "hk/kernel_loader.h"
#include "hk/layers.h"

namespace hk::kernel_binding {

// True for the layer names activation modules register.
bool is_activation_layer(const std::string& layer);

// The activation code (kActivation*) an entry named like kernels-community/activation's entries
// computes ("Silu", "GELU", "GeluTanh", "QuickGELU", ...), or nullopt for a name hk does not know
// (an activation@1 entry computes one fixed function; the kernel refuses a call whose attrs.kind
// names another, so a known mismatch is reported at bind time instead).
std::optional<uint32_t> activation_entry_kind(const std::string& entry_name);
uint32_t activation_code(ops::Activation kind);

// An implementation of `module` calling `fn` (an activation@1 or silu@1 entry).
std::shared_ptr<nn::LayerImpl> make_activation_adapter(const nn::Activation& module,
                                                       KernelFunction fn,
                                                       const std::string& display_name);

}  // namespace hk::kernel_binding
