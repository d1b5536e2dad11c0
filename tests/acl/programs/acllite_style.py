"""A text model run through helper classes written the way acllite writes them (a resource class whose
``__del__`` releases the stream, context, device and ACL; a model class whose ``__del__`` frees its datasets
and unloads the model; a registry the resource releases first), then the objects released in the order the
first argument says — including the orders an interpreter's exit produces.

    python acllite_style.py model.om weights.npz {explicit|resource_first|context_first|at_exit}
"""
import sys

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
ACL_HOST = 1
NPY_FLOAT32 = 11


def log_info(*msg):
    frame = sys._getframe().f_back
    acl.app_log(1, f"[{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}]" + "".join(map(str, msg)))


def log_warning(*msg):
    text = "".join(map(str, msg))
    print("[WARNING]", text)
    acl.app_log(2, text)


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{message} failed ret={ret}")


class _ResourceList:
    def __init__(self):
        self.resources = []

    def register(self, resource):
        self.resources.append(resource)

    def unregister(self, resource):
        if resource in self.resources:
            self.resources.remove(resource)

    def destroy(self):
        for r in list(self.resources):
            r.destroy()


resource_list = _ResourceList()
released = []          # what each release step returned, printed at the end


class LiteResource:
    def __init__(self, device_id=0):
        self.device_id = device_id
        self.context = None
        self.stream = None
        self.run_mode = None

    def init(self):
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check_ret("acl.rt.create_stream", ret)
        self.run_mode, ret = acl.rt.get_run_mode()
        check_ret("acl.rt.get_run_mode", ret)
        log_info("Init resource success")

    def __del__(self):
        log_info("acl resource release all resource")
        resource_list.destroy()
        if self.stream:
            released.append(("destroy_stream", acl.rt.destroy_stream(self.stream)))
        if self.context:
            released.append(("destroy_context", acl.rt.destroy_context(self.context)))
        released.append(("reset_device", acl.rt.reset_device(self.device_id)))
        released.append(("finalize", acl.finalize()))
        log_info("Release acl resource success")


class LiteModel:
    def __init__(self, model_path):
        self._run_mode, ret = acl.rt.get_run_mode()
        check_ret("acl.rt.get_run_mode", ret)
        self._model_id, ret = acl.mdl.load_from_file(model_path)
        check_ret("acl.mdl.load_from_file", ret)
        self._model_desc = acl.mdl.create_desc()
        check_ret("acl.mdl.get_desc", acl.mdl.get_desc(self._model_desc, self._model_id))
        self._output_dataset = self._gen_output_dataset(acl.mdl.get_num_outputs(self._model_desc))
        self._input_num = acl.mdl.get_num_inputs(self._model_desc)
        _, ret = acl.mdl.get_input_index_by_name(self._model_desc, "ascend_mbatch_shape_data")
        self._is_dynamic = ret == ACL_SUCCESS
        self._is_released = False
        resource_list.register(self)

    def _gen_output_dataset(self, size):
        dataset = acl.mdl.create_dataset()
        for i in range(size):
            n = acl.mdl.get_output_size_by_index(self._model_desc, i)
            ptr, ret = acl.rt.malloc(n, ACL_MEM_MALLOC_NORMAL_ONLY)
            check_ret("acl.rt.malloc", ret)
            _, ret = acl.mdl.add_dataset_buffer(dataset, acl.create_data_buffer(ptr, n))
            check_ret("acl.add_dataset_buffer", ret)
        return dataset

    def _gen_input_dataset(self, input_list):
        dataset = acl.mdl.create_dataset()
        for i, item in enumerate(input_list):
            data = np.ascontiguousarray(item)
            size = data.nbytes
            model_size = acl.mdl.get_input_size_by_index(self._model_desc, i)
            if size != model_size:
                log_warning(f"Input[{i}] size: {size} not equal om size: {model_size}, may cause inference result "
                            f"error, please check model input")
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
            check_ret("acl.rt.malloc", ret)
            check_ret("acl.rt.memcpy", acl.rt.memcpy(ptr, size, acl.util.numpy_to_ptr(data), size,
                                                     ACL_MEMCPY_HOST_TO_DEVICE))
            _, ret = acl.mdl.add_dataset_buffer(dataset, acl.create_data_buffer(ptr, size))
            check_ret("acl.add_dataset_buffer", ret)
        return dataset

    def _release_dataset(self, dataset, free_memory=True):
        for i in range(acl.mdl.get_dataset_num_buffers(dataset)):
            buf = acl.mdl.get_dataset_buffer(dataset, i)
            if buf:
                if free_memory:
                    released.append(("free", acl.rt.free(acl.get_data_buffer_addr(buf))))
                released.append(("destroy_data_buffer", acl.destroy_data_buffer(buf)))
        released.append(("destroy_dataset", acl.mdl.destroy_dataset(dataset)))

    def execute(self, input_list):
        dataset = self._gen_input_dataset(input_list)
        ret = acl.mdl.execute(self._model_id, dataset, self._output_dataset)
        self._release_dataset(dataset)
        if ret != ACL_SUCCESS:
            return ret
        buf = acl.mdl.get_dataset_buffer(self._output_dataset, 0)
        dims, ret = acl.mdl.get_cur_output_dims(self._model_desc, 0)
        check_ret("acl.mdl.get_cur_output_dims", ret)
        out = np.zeros(dims["dims"], np.float32)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes,
                                                 acl.get_data_buffer_addr(buf), out.nbytes, ACL_MEMCPY_DEVICE_TO_HOST))
        return out

    def destroy(self):
        if self._is_released:
            return
        self._release_dataset(self._output_dataset)
        if self._model_id:
            released.append(("unload", acl.mdl.unload(self._model_id)))
        if self._model_desc:
            released.append(("destroy_desc", acl.mdl.destroy_desc(self._model_desc)))
        self._is_released = True
        resource_list.unregister(self)

    def __del__(self):
        self.destroy()


def main(model_path, weights_path, order):
    w = np.load(weights_path)["w"]
    resource = LiteResource()
    resource.init()
    assert resource.run_mode == ACL_HOST
    model = LiteModel(model_path)
    assert not model._is_dynamic
    ids = np.arange(1, 17, dtype=np.int32).reshape(1, 16)
    np.testing.assert_allclose(model.execute([ids]), ids * w, rtol=1e-6)
    short = ids[:, :10]                                # a short text input: acllite warns, CANN runs it
    padded = np.zeros((1, 16), np.int32)
    padded[:, :10] = short
    np.testing.assert_allclose(model.execute([short]), padded * w, rtol=1e-6)
    ret = model.execute([np.arange(20, dtype=np.int32).reshape(1, 20)])    # longer: refused
    print("longer input:", ret)
    assert ret == 145000, ret
    if order == "explicit":
        model.destroy()
        del resource
    elif order == "resource_first":                   # finalize first; the model's own __del__ comes after it
        resource_list.unregister(model)
        del resource
        del model
    elif order == "context_first":
        released.append(("destroy_context", acl.rt.destroy_context(resource.context)))
        model.destroy()
        del resource
    elif order == "at_exit":                          # left to the interpreter's exit
        globals()["kept"] = (model, resource)
        print("leaving them to the interpreter")
        return
    print("released:", " ".join(f"{name}={ret}" for name, ret in released))
    print("OK")


if __name__ == "__main__":
    main(*sys.argv[1:4])
