#!/usr/bin/env bash
# probe.sh BUILD CC NVCC CUDA — find what this machine can build with, by
# compiling and linking a tiny program for each capability (never by asking
# dpkg), and write the answers to BUILD/config.mk for the Makefile.
#
# The answers are cached under a key of the inputs and the package database's
# time stamp, so installing a package re-probes and an unchanged machine does
# not pay for nvcc on every make.
set -u
build=$1 cc=$2 nvcc=$3 cuda=$4
out="$build/config.mk"
pkgstamp=$(stat -c %Y /var/lib/dpkg/status 2>/dev/null || echo 0)
key="5|$cc|$nvcc|$cuda|$pkgstamp"  # bump the first field when a probe is added
if [[ -f "$out" ]] && head -n 1 "$out" | grep -qxF "# key: $key"; then exit 0; fi

dir="$build/probe"
mkdir -p "$dir"

try_c() { # try_c NAME FLAGS... < program
  cat > "$dir/$1.c"
  local name=$1; shift
  "$cc" -o "$dir/$name" "$dir/$name.c" "$@" >/dev/null 2>&1
}

openblas=0; dnnl=0; openmp=0; have_cuda=0; nccl=0; cuda_home=""; grpc_tls13=0
mpi=0; mpi_cflags=""; mpi_libs=""

printf '#include <cblas.h>\nint main(void){float x=1;return (int)cblas_sdot(1,&x,1,&x,1)-1;}\n' \
  | try_c openblas -lopenblas && openblas=1
printf '#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel reduction(+:n)\nn+=1;\nreturn omp_get_max_threads()>0&&n>0?0:1;}\n' \
  | try_c openmp -fopenmp && openmp=1
# oneDNN 2 (Debian 12's libdnnl): bf16 matmuls on AMX or AVX-512 BF16 for a
# frozen base, through v2's matmul descriptor (v3 dropped it)
printf '#include <oneapi/dnnl/dnnl.h>\n#if DNNL_VERSION_MAJOR != 2\n#error v2\n#endif\nint main(void){dnnl_matmul_desc_t d;dnnl_memory_desc_t m;dnnl_dims_t s={1,1};dnnl_memory_desc_init_by_strides(&m,2,s,dnnl_bf16,s);return dnnl_matmul_desc_init(&d,&m,&m,NULL,&m)==dnnl_success?0:1;}\n' \
  | try_c dnnl -ldnnl && dnnl=1

# gRPC core 1.51 has no C setter for the TLS version; Debian's libgrpc
# exports the C++ member that sets it (net/NOTES-grpc-core.md). Found or not,
# the build says so: without it the coordinator also accepts TLS 1.2.
printf 'struct c;extern void f(struct c*,int) __asm__("_ZN27grpc_ssl_server_credentials19set_min_tls_versionE16grpc_tls_version");extern void g(struct c*,int) __asm__("_ZN20grpc_ssl_credentials19set_min_tls_versionE16grpc_tls_version");int main(int n,char**v){(void)v;if(n>5){f(0,1);g(0,1);}return 0;}\n' \
  | try_c grpc_tls13 -lgrpc -lgpr && grpc_tls13=1

# MPI (Open MPI from Debian) for sites on several ranks: its compiler
# wrapper says where it is; its headers go in as system headers.
if command -v mpicc >/dev/null 2>&1; then
  mpi_cflags=$(mpicc --showme:compile 2>/dev/null | sed 's/-I/-isystem /g')
  mpi_libs=$(mpicc --showme:link 2>/dev/null)
  # shellcheck disable=SC2086
  printf '#include <mpi.h>\nint main(void){int f=0;MPI_Initialized(&f);return f;}\n' \
    | try_c mpi $mpi_cflags $mpi_libs && mpi=1
fi

if [[ "$cuda" != 0 && -n "$nvcc" && -x "$nvcc" ]]; then
  cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd -P)
  libdir="$cuda_home/lib64"
  [[ -d "$libdir" ]] || libdir="$cuda_home/lib"
  printf '#include <cublas_v2.h>\n__global__ void k(float*x){x[threadIdx.x]=0;}\nint main(){cublasHandle_t h;k<<<1,1>>>(0);return cublasCreate(&h)==CUBLAS_STATUS_SUCCESS?0:1;}\n' > "$dir/cuda.cu"
  if "$nvcc" -o "$dir/cuda" "$dir/cuda.cu" -lcublas >/dev/null 2>&1; then
    have_cuda=1
    printf '#include <nccl.h>\nint main(void){int v;return ncclGetVersion(&v)==ncclSuccess?0:1;}\n' \
      | try_c nccl -I"$cuda_home/include" -L"$libdir" -lnccl && nccl=1
  fi
fi

{
  echo "# key: $key"
  echo "HAVE_OPENBLAS := $openblas"
  echo "HAVE_OPENMP := $openmp"
  echo "HAVE_DNNL := $dnnl"
  echo "HAVE_CUDA := $have_cuda"
  echo "HAVE_NCCL := $nccl"
  echo "CUDA_HOME := $cuda_home"
  echo "HAVE_GRPC_TLS13 := $grpc_tls13"
  echo "HAVE_MPI := $mpi"
  echo "MPI_CFLAGS := $mpi_cflags"
  echo "MPI_LIBS := $mpi_libs"
} > "$out.tmp" && mv "$out.tmp" "$out"
