# lit configuration for TorchNeuron's IR tests (FileCheck, -verify-diagnostics).
import os

import lit.formats

config.name = "TorchNeuron"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.neuron_obj_root
path = os.pathsep.join([config.neuron_tools_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ.get("PATH", ""))])
config.environment["PATH"] = path
